"""Gateway building blocks without a server: keys, config, auth rules, limits, header filtering, CLI."""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from otel_llm.tools.main import main
from otel_llm.tools.gateway import keys as keys_module
from otel_llm.tools.gateway.auth import Denied, KeyStore, check_model, check_path, check_route, credentials
from otel_llm.tools.gateway.settings import ENV_VARS, ConfigError, KeyPolicy, load_config
from otel_llm.tools.gateway.keys import KEY_PREFIX, digest_key, format_hash, generate_key, match_key, parse_hash
from otel_llm.tools.gateway.limits import Admission, KeyLimits, Rejected, TokenBucket
from otel_llm.tools.gateway.header_rules import request_headers, response_headers

UPSTREAM = "http://127.0.0.1:11434"
_KEY_RE = re.compile(r"olk_[A-Za-z0-9_-]{43}")


def _policy(key_id: str = "alice", **fields: Any) -> KeyPolicy:
    return KeyPolicy(key_id=key_id, digest=digest_key(f"secret-{key_id}"), **fields)


def _keys_file(tmp_path: Path, text: str | None = None, name: str = "keys.toml") -> Path:
    path = tmp_path / name
    path.write_text(f'[keys.alice]\nhash = "{format_hash("olk_alice")}"\n' if text is None else text)
    return path


def _alice(extra: str = "") -> str:
    return f'[keys.alice]\nhash = "{format_hash("olk_alice")}"\n{extra}'


# --- keys ------------------------------------------------------------------------------------


def test_generate_key_is_prefixed_random_and_url_safe() -> None:
    generated = {generate_key() for _ in range(50)}
    assert len(generated) == 50
    for key in generated:
        assert key.startswith(KEY_PREFIX) and _KEY_RE.fullmatch(key), key


def test_format_and_parse_hash_round_trip() -> None:
    key = "olk_example"
    stored = format_hash(key)
    assert stored == "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    assert parse_hash(stored) == hashlib.sha256(key.encode()).digest()
    assert parse_hash(stored.upper().replace("SHA256", "sha256")) == digest_key(key)  # hex case is free


@pytest.mark.parametrize("text", [
    "", "abc", "sha256", "sha256:", "SHA256:" + "0" * 64, "sha512:" + "0" * 128, "md5:" + "0" * 32,
    "sha256:" + "0" * 63, "sha256:" + "0" * 62, "sha256:" + "0" * 66, "sha256:" + "zz" * 32,
])
def test_parse_hash_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError):
        parse_hash(text)


def test_match_key_picks_the_right_entry_and_rejects_near_misses() -> None:
    keys = {name: generate_key() for name in ("alice", "bob", "carol")}
    stored = [(digest_key(secret), name) for name, secret in keys.items()]
    for name, secret in keys.items():
        assert match_key(secret, stored) == name
        assert match_key(secret, dict(stored)) == name  # a mapping works too
    secret = keys["bob"]
    last = secret[-1]
    near_misses = [secret[:-1], secret + "x", secret[:-1] + ("A" if last != "A" else "B"), secret.upper(),
                   " " + secret, secret + "\n", secret[len(KEY_PREFIX):], "", "olk_", keys["alice"][:-1]]
    for presented in near_misses:
        assert match_key(presented, stored) is None, presented


def test_match_key_compares_every_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Constant time: the number of comparisons does not depend on where (or whether) it matched."""
    calls: list[int] = []
    real = keys_module.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(keys_module.hmac, "compare_digest", counting)
    secrets_ = [generate_key() for _ in range(5)]
    stored = [(digest_key(s), i) for i, s in enumerate(secrets_)]
    for presented in (secrets_[0], secrets_[4], "olk_nope"):
        calls.clear()
        match_key(presented, stored)
        assert len(calls) == 5


# --- config ----------------------------------------------------------------------------------


def test_config_precedence_file_then_env_then_cli(tmp_path: Path) -> None:
    keys = _keys_file(tmp_path, _alice() + f'[keys.shared]\nhash = "{format_hash("olk_from_keys_file")}"\n')
    config_file = tmp_path / "gateway.toml"
    config_file.write_text(
        'upstream = "http://file-host:1"\nlisten = "127.0.0.1:1111"\nmax_concurrency = 3\nmax_queue = 5\n'
        'max_queue_wait = 7.5\nmax_body_bytes = 111\nruntime = "ollama"\n'
        f'[keys.fromconfig]\nhash = "{format_hash("olk_from_config")}"\nroutes = ["/api/*"]\n'
        f'[keys.shared]\nhash = "{format_hash("olk_from_config_shared")}"\n'
    )
    environ = {
        "OTEL_LLM_GATEWAY_CONFIG": str(config_file),
        "OTEL_LLM_GATEWAY_UPSTREAM": "http://env-host:2",
        "OTEL_LLM_GATEWAY_MAX_QUEUE": "6",
        "OTEL_LLM_GATEWAY_MAX_CONCURRENCY": "",  # empty variables are ignored
        "OTEL_LLM_GATEWAY_KEYS": str(keys),
        "OTEL_LLM_GATEWAY_RUNTIME": "vllm",
    }
    config = load_config({"upstream": "http://cli-host:3", "listen": None, "max_body_bytes": 222,
                          "runtime": None}, environ)
    assert config.upstream == "http://cli-host:3"  # CLI over env over file
    assert config.listen == "127.0.0.1:1111"  # a None CLI value does not override
    assert config.max_concurrency == 3  # file (the empty variable did not count)
    assert config.max_queue == 6  # env over file
    assert config.max_queue_wait == 7.5
    assert config.max_body_bytes == 222
    assert config.runtime == "vllm"
    by_id = {p.key_id: p for p in config.keys}
    assert set(by_id) == {"alice", "fromconfig", "shared"}
    assert by_id["fromconfig"].routes == ("/api/*",)
    assert by_id["shared"].digest == digest_key("olk_from_keys_file")  # keys file over config file
    # the CLI's config file wins over the variable's
    other = tmp_path / "other.toml"
    other.write_text("max_queue_wait = 1.25\n")
    config = load_config({"config_file": str(other), "upstream": UPSTREAM}, environ)
    assert config.max_queue_wait == 1.25 and config.max_queue == 6


def test_config_defaults_and_key_policy_defaults(tmp_path: Path) -> None:
    keys = _keys_file(tmp_path, _alice("rate = 2.5\n")
                      + f'[keys.bob]\nhash = "{format_hash("olk_bob")}"\nrate = 0.5\n'
                      + f'[keys.carol]\nhash = "{format_hash("olk_carol")}"\n')
    config = load_config({"upstream": UPSTREAM, "keys_file": str(keys)}, {})
    assert (config.listen, config.max_concurrency, config.max_queue) == ("127.0.0.1:8080", 8, 64)
    assert config.listen_host == "127.0.0.1" and config.listen_port == 8080
    by_id = {p.key_id: p for p in config.keys}
    assert by_id["alice"].burst == 3 and by_id["bob"].burst == 1  # default burst: max(1, ceil(rate))
    carol = by_id["carol"]
    assert (carol.routes, carol.models, carol.rate, carol.burst, carol.max_concurrency) == (
        ("*",), None, None, None, None)


def test_keys_file_accepts_bare_tables(tmp_path: Path) -> None:
    keys = _keys_file(tmp_path, f'[alice]\nhash = "{format_hash("olk_alice")}"\nmodels = ["m1"]\n')
    (policy,) = load_config({"upstream": UPSTREAM, "keys_file": str(keys)}, {}).keys
    assert policy.key_id == "alice" and policy.models == ("m1",)


_BAD_KEYS: dict[str, tuple[str, list[str]]] = {  # keys file text -> words the message must contain
    "bad_scheme": (_alice().replace("sha256:", "md5:"), ["key 'alice'", "sha256:<64 hex digits>"]),
    "short_hash": ('[keys.alice]\nhash = "sha256:abcd"\n', ["key 'alice'", "64 hex digits"]),
    "not_hex": (f'[keys.alice]\nhash = "sha256:{"zz" * 32}"\n', ["key 'alice'", "not hexadecimal"]),
    "no_hash": ('[keys.alice]\nroutes = ["/v1/*"]\n', ["key 'alice'", "no hash"]),
    "unknown_field": (_alice('colour = "red"\n'), ["key 'alice'", "unknown field", "colour"]),
    "plain_key_field": (_alice('key = "olk_x"\n'), ["key 'alice'", "unknown field", "key"]),
    "not_a_table": ('alice = "sha256:00"\n', ["key 'alice'", "must be a table"]),
    "rate_zero": (_alice("rate = 0\n"), ["key 'alice'", "rate must be a positive number"]),
    "rate_negative": (_alice("rate = -1.5\n"), ["key 'alice'", "rate"]),
    "rate_bool": (_alice("rate = true\n"), ["key 'alice'", "rate"]),
    "rate_string": (_alice('rate = "fast"\n'), ["key 'alice'", "rate"]),
    "rate_inf": (_alice("rate = inf\n"), ["key 'alice'", "rate"]),
    "burst_zero": (_alice("rate = 1\nburst = 0\n"), ["key 'alice'", "burst"]),
    "burst_without_rate": (_alice("burst = 3\n"), ["key 'alice'", "burst needs a rate"]),
    "concurrency_negative": (_alice("max_concurrency = -1\n"), ["key 'alice'", "max_concurrency"]),
    "routes_string": (_alice('routes = "/v1/*"\n'), ["key 'alice'", "routes must be a list of strings"]),
    "routes_relative": (_alice('routes = ["v1/*"]\n'), ["key 'alice'", "routes", "'/'"]),
    "routes_numbers": (_alice("routes = [1]\n"), ["key 'alice'", "routes must be a list of strings"]),
    "models_string": (_alice('models = "m"\n'), ["key 'alice'", "models must be a list of strings"]),
    "duplicate_hash": (_alice() + f'[keys.bob]\nhash = "{format_hash("olk_alice")}"\n',
                       ["'alice'", "'bob'", "same hash"]),
    "empty": ("", ["no API keys configured", "--keys"]),
    "invalid_toml": ("[keys.alice\nhash=", ["keys.toml", "not valid TOML"]),
}


@pytest.mark.parametrize("case", sorted(_BAD_KEYS))
def test_bad_keys_file_names_the_problem(tmp_path: Path, case: str) -> None:
    text, words = _BAD_KEYS[case]
    keys = _keys_file(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config({"upstream": UPSTREAM, "keys_file": str(keys)}, {})
    for word in words:
        assert word in str(info.value), (word, str(info.value))


_BAD_SETTINGS: dict[str, tuple[dict[str, Any], list[str]]] = {  # overrides -> words the message must contain
    "no_upstream": ({"upstream": None}, ["upstream must be an http(s) URL"]),
    "upstream_no_scheme": ({"upstream": "localhost:11434"}, ["upstream", "localhost:11434"]),
    "upstream_ftp": ({"upstream": "ftp://127.0.0.1/x"}, ["upstream must be an http(s) URL"]),
    "upstream_no_host": ({"upstream": "http://"}, ["upstream must be an http(s) URL"]),
    "upstream_credentials": ({"upstream": "http://user:hunter2@127.0.0.1:1"}, ["upstream", "credentials"]),
    "listen_no_port": ({"listen": "8080"}, ["listen must be HOST:PORT", "8080"]),
    "listen_big_port": ({"listen": "127.0.0.1:99999"}, ["listen must be HOST:PORT"]),
    "listen_word_port": ({"listen": "127.0.0.1:http"}, ["listen must be HOST:PORT"]),
    "max_concurrency_zero": ({"max_concurrency": 0}, ["max_concurrency must be a positive number"]),
    "max_queue_negative": ({"max_queue": -1}, ["max_queue must be a non-negative number"]),
    "max_queue_wait_nan": ({"max_queue_wait": "nan"}, ["max_queue_wait"]),
    "max_queue_wait_negative": ({"max_queue_wait": -0.5}, ["max_queue_wait"]),
    "max_body_bytes_zero": ({"max_body_bytes": 0}, ["max_body_bytes must be a positive number"]),
    "upstream_timeout_zero": ({"upstream_timeout": 0}, ["upstream_timeout must be a positive number"]),
    "upstream_timeout_inf": ({"upstream_timeout": "inf"}, ["upstream_timeout"]),
    "max_queue_word": ({"max_queue": "lots"}, ["max_queue must be a number", "lots"]),
    "access_log_empty": ({"access_log": ""}, ["access_log"]),
    "workers_zero": ({"workers": 0}, ["workers must be a positive number"]),
    "workers_word": ({"workers": "all"}, ["workers must be a number", "all"]),
    "workers_too_many": ({"workers": 257}, ["workers must be at most 256", "257"]),
    "missing_keys_file": ({"keys_file": "/nonexistent/keys.toml"}, ["no such file", "/nonexistent/keys.toml"]),
    "missing_config_file": ({"config_file": "/nonexistent/gw.toml"}, ["no such file", "/nonexistent/gw.toml"]),
}


@pytest.mark.parametrize("case", sorted(_BAD_SETTINGS))
def test_bad_setting_names_the_setting(tmp_path: Path, case: str) -> None:
    overrides, words = _BAD_SETTINGS[case]
    settings = {"upstream": UPSTREAM, "keys_file": str(_keys_file(tmp_path)), **overrides}
    with pytest.raises(ConfigError) as info:
        load_config(settings, {})
    message = str(info.value)
    for word in words:
        assert word in message, (word, message)
    assert "hunter2" not in message  # a credential in the URL is not echoed


def test_bad_setting_from_environment_and_config_file(tmp_path: Path) -> None:
    keys = str(_keys_file(tmp_path))
    with pytest.raises(ConfigError, match="max_concurrency must be a number"):
        load_config({"upstream": UPSTREAM, "keys_file": keys}, {ENV_VARS["max_concurrency"]: "eight"})
    config_file = tmp_path / "gw.toml"
    config_file.write_text('upstream = "http://127.0.0.1:1"\ncolour = "red"\n')
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) colour"):
        load_config({"config_file": str(config_file), "keys_file": keys}, {})


# --- authentication and authorization --------------------------------------------------------


def _denied(call: Any, *args: Any) -> Denied:
    with pytest.raises(Denied) as info:
        call(*args)
    return info.value


def test_credentials_bearer_and_x_api_key() -> None:
    assert credentials([(b"authorization", b"Bearer olk_abc")]) == "olk_abc"
    assert credentials([(b"authorization", b"bearer   olk_abc  ")]) == "olk_abc"
    assert credentials([(b"x-api-key", b" olk_abc ")]) == "olk_abc"
    # the same secret twice is one secret
    assert credentials([(b"authorization", b"Bearer olk_abc"), (b"x-api-key", b"olk_abc")]) == "olk_abc"
    assert credentials([(b"x-api-key", b"k" * 512)]) == "k" * 512


def test_credentials_missing_is_401_with_challenge() -> None:
    for headers in ([], [(b"cookie", b"session=olk_abc"), (b"x-api-token", b"olk_abc")]):
        denied = _denied(credentials, headers)
        assert (denied.status, denied.outcome) == (401, "unauthorized")
        assert ("www-authenticate", 'Bearer realm="otel-llm-gateway"') in denied.headers


@pytest.mark.parametrize("headers", [
    [(b"authorization", b"Basic b2xrX2FiYzo=")],
    [(b"authorization", b"Bearer")],
    [(b"authorization", b"Bearer    ")],
    [(b"authorization", b"olk_abc")],
    [(b"x-api-key", b"")],
    [(b"x-api-key", b"   ")],
    [(b"x-api-key", b"k" * 513)],
    [(b"authorization", b"Bearer " + b"k" * 10_000)],
])
def test_credentials_malformed_is_401_invalid_token(headers: list[tuple[bytes, bytes]]) -> None:
    denied = _denied(credentials, headers)
    assert (denied.status, denied.outcome) == (401, "unauthorized")
    assert any(n == "www-authenticate" and 'error="invalid_token"' in v for n, v in denied.headers)


@pytest.mark.parametrize("headers", [
    [(b"authorization", b"Bearer olk_a"), (b"x-api-key", b"olk_b")],
    [(b"authorization", b"Bearer olk_a"), (b"authorization", b"Bearer olk_b")],
    [(b"x-api-key", b"olk_a"), (b"x-api-key", b"olk_b")],
])
def test_two_different_secrets_is_400(headers: list[tuple[bytes, bytes]]) -> None:
    denied = _denied(credentials, headers)
    assert (denied.status, denied.outcome) == (400, "bad_request")
    assert "olk_a" not in denied.message and "olk_b" not in denied.message


def test_keystore_authenticates_and_rejects() -> None:
    alice, bob = _policy("alice"), _policy("bob")
    store = KeyStore([alice, bob])
    assert len(store) == 2
    assert store.authenticate("secret-bob") is bob
    for wrong in ("secret-bo", "secret-bobb", "SECRET-BOB", ""):
        denied = _denied(store.authenticate, wrong)
        assert (denied.status, denied.outcome, denied.message) == (401, "unauthorized", "invalid API key")


@pytest.mark.parametrize("path,raw", [
    ("/v1/chat/completions", None),
    ("/v1/chat/completions", b"/v1/chat/completions"),
    ("/api/tags", b"/api/tags"),
    ("/v1/models/gemma3:270m", b"/v1/models/gemma3:270m"),
    ("/v1/a.b/c..d", b"/v1/a.b/c..d"),  # dots inside a segment are fine
    ("/v1/a b", b"/v1/a%20b"),
    ("/", b"/"),
])
def test_check_path_accepts_plain_paths(path: str, raw: bytes | None) -> None:
    check_path(path, raw)


@pytest.mark.parametrize("path,raw", [
    ("/v1/../sim/stats", b"/v1/../sim/stats"),
    ("/v1/..", b"/v1/.."),
    ("/..", b"/.."),
    ("/v1/./chat", b"/v1/./chat"),
    ("/v1/.", b"/v1/."),
    ("/v1//chat", b"/v1//chat"),
    ("//v1/chat", b"//v1/chat"),
    ("/v1\\..\\sim", b"/v1\\..\\sim"),
    ("/v1/x\x00", b"/v1/x"),
    ("v1/chat", b"v1/chat"),
    ("", b""),
    # decoded by the server: either the decoded path or the raw one gives it away
    ("/v1/../sim/stats", b"/v1/%2e%2e/sim/stats"),
    ("/v1/../sim/stats", b"/v1/%2e%2E%2fsim/stats"),
    ("/v1/chat/completions", b"/v1%2fchat/completions"),
    ("/v1/chat/completions", b"/v1%2Fchat/completions"),
    ("/v1/chat\\completions", b"/v1/chat%5ccompletions"),
    ("/v1/chat/completions", b"/v1/chat%5Ccompletions"),
    ("/v1/chat/completions", b"/v1/chat/completions%00"),
    ("/v1/chat/.x", b"/v1/chat/%2ex"),
])
def test_check_path_rejects_ambiguous_paths(path: str, raw: bytes) -> None:
    denied = _denied(check_path, path, raw)
    assert (denied.status, denied.outcome) == (400, "bad_request")


def test_check_route_globs() -> None:
    chat_only = _policy(routes=("/v1/chat/completions",))
    v1 = _policy(routes=("/v1/*", "/api/tags"))
    check_route(chat_only, "/v1/chat/completions")
    check_route(v1, "/v1/chat/completions")
    check_route(v1, "/v1/models")
    check_route(v1, "/api/tags")
    check_route(_policy(), "/anything/at/all")  # default: every route
    for policy, path in ((chat_only, "/v1/models"), (chat_only, "/v1/chat/completions/"),
                         (chat_only, "/V1/chat/completions"), (v1, "/api/generate"), (v1, "/v1"),
                         (v1, "/sim/stats"), (v1, "/api/tags/x")):
        denied = _denied(check_route, policy, path)
        assert (denied.status, denied.outcome) == (403, "forbidden"), path


def test_check_route_methods_default_to_the_routes_api() -> None:
    """A route without methods allows what its API is called with: POST on a model route, GET,
    HEAD and POST elsewhere; anything else (DELETE, PUT, TRACE...) must be named."""
    v1 = _policy(routes=("/v1/*", "/api/*"))
    check_route(v1, "/v1/chat/completions", "POST")
    check_route(v1, "/v1/models", "GET")
    check_route(v1, "/api/tags", "HEAD")
    check_route(v1, "/api/show", "POST")
    for method, path in (("GET", "/v1/chat/completions"), ("PUT", "/v1/chat/completions"),
                         ("DELETE", "/api/delete"), ("TRACE", "/v1/models"), ("OPTIONS", "/v1/models"),
                         ("PATCH", "/api/tags"), ("GET", "/api/generate")):
        denied = _denied(check_route, v1, path, method)
        assert (denied.status, denied.outcome) == (403, "forbidden"), (method, path)
        assert method in denied.message


def test_check_route_named_methods() -> None:
    policy = _policy(routes=("GET /v1/models", "POST,DELETE /api/*", "* /sim/*"))
    check_route(policy, "/v1/models", "GET")
    check_route(policy, "/api/delete", "DELETE")
    check_route(policy, "/sim/anything", "TRACE")
    for method, path in (("POST", "/v1/models"), ("HEAD", "/v1/models"), ("GET", "/api/tags"),
                         ("POST", "/v1/chat/completions")):
        denied = _denied(check_route, policy, path, method)
        assert (denied.status, denied.outcome) == (403, "forbidden"), (method, path)


@pytest.mark.parametrize("route", ["v1/*", "GET", "GET  ", "get; /v1/*", "GE-T /v1/*", "GET, /v1/*", ""])
def test_malformed_routes_stop_the_config(route: str) -> None:
    from otel_llm.tools.gateway.settings import split_route

    with pytest.raises(ValueError):
        split_route(route)


def test_check_model_unrestricted_key_reads_nothing() -> None:
    assert check_model(_policy(), b"not json at all {") is None
    assert check_model(_policy(), b'{"model": "a", "model": "b"}') is None


def test_check_model_restricted_key() -> None:
    policy = _policy(models=("gemma3:270m", "qwen"))
    assert check_model(policy, b'{"model": "gemma3:270m", "messages": []}') == "gemma3:270m"
    assert check_model(policy, b'  {"model":"qwen"}\n') == "qwen"
    assert check_model(policy, b"", "GET") is None  # GET /v1/models: nothing to check
    assert check_model(policy, b"", "HEAD") is None
    for method, body in (("POST", b""), ("POST", b"  \r\n\t"), ("PUT", b""), ("GET", b" ")):
        denied = _denied(check_model, policy, body, method)  # a model route must name its model
        assert (denied.status, denied.outcome) == (400, "bad_request"), (method, body)
    for body in (b'{"model": "llama3"}', b'{"model": "GEMMA3:270M"}', b'{"messages": []}', b'{"model": null}',
                 b'{"model": ["gemma3:270m"]}', b'{"model": 1}', b'{"Model": "gemma3:270m"}'):
        denied = _denied(check_model, policy, body)
        assert (denied.status, denied.outcome) == (403, "forbidden"), body
    for body in (b'{"model": "gemma3:270m", "model": "llama3"}', b'{"model": "llama3", "model": "gemma3:270m"}',
                 b'{"model": "gemma3:270m", "mod\\u0065l": "llama3"}', b"[]", b'"gemma3:270m"', b"{",
                 b'{"model": "gemma3:270m"} {"model": "llama3"}', b"[" * 100_000, b"\xff\xfe"):
        denied = _denied(check_model, policy, body)
        assert (denied.status, denied.outcome) == (400, "bad_request"), body[:60]


def test_check_model_rejects_case_variant_duplicate_model() -> None:
    """Go's encoding/json (Ollama, via gin) maps keys to struct fields case-insensitively and the
    last one wins, so ``{"model": allowed, "Model": other}`` runs ``other`` there while Python sees
    ``allowed``: the same parser disagreement the duplicate-"model" rule exists to stop."""
    policy = _policy(models=("gemma3:270m",))
    for body in (b'{"model": "gemma3:270m", "Model": "llama3:70b"}',
                 b'{"model": "gemma3:270m", "MODEL": "llama3:70b"}'):
        denied = _denied(check_model, policy, body)
        assert denied.status in (400, 403), body


# --- limits ----------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_burst_then_refill_at_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, burst=3, clock=clock)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.5)
    assert bucket.take() == pytest.approx(0.5)  # a refused take costs nothing
    clock.now += 0.25
    assert bucket.take() == pytest.approx(0.25)
    clock.now += 0.25
    assert bucket.take() == 0.0
    assert bucket.take() == pytest.approx(0.5)
    clock.now += 3600  # a long idle refills only up to the burst
    assert [bucket.take() for _ in range(4)] == [0.0, 0.0, 0.0, pytest.approx(0.5)]


def test_token_bucket_slow_rate_retry_after() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=0.1, burst=1, clock=clock)
    assert bucket.take() == 0.0
    assert bucket.take() == pytest.approx(10.0)
    clock.now += 4
    assert bucket.take() == pytest.approx(6.0)


def test_key_limits_rate() -> None:
    limits = KeyLimits(rate=0.001, burst=2, max_concurrency=None)
    limits.enter()
    limits.enter()
    with pytest.raises(Rejected) as info:
        limits.enter()
    assert info.value.reason == "rate_limited"
    assert isinstance(info.value.retry_after, int) and 990 <= info.value.retry_after <= 1000
    assert limits.in_flight == 2  # the refused request is not counted
    # Retry-After is clamped to an hour
    slow = KeyLimits(rate=1e-6, burst=1, max_concurrency=None)
    slow.enter()
    with pytest.raises(Rejected) as info:
        slow.enter()
    assert info.value.retry_after == 3600


def test_key_limits_concurrency_does_not_spend_tokens() -> None:
    limits = KeyLimits(rate=0.001, burst=2, max_concurrency=1)
    limits.enter()
    with pytest.raises(Rejected) as info:
        limits.enter()
    assert (info.value.reason, info.value.retry_after) == ("rate_limited", 1)
    limits.leave()
    limits.enter()  # the concurrency refusal did not use the second token
    limits.leave()
    with pytest.raises(Rejected):
        limits.enter()
    assert limits.in_flight == 0


def test_key_limits_unlimited() -> None:
    limits = KeyLimits(rate=None, burst=None, max_concurrency=None)
    for _ in range(1000):
        limits.enter()
    assert limits.in_flight == 1000 and limits.bucket is None


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_admission_slots_and_handover() -> None:
    async def scenario() -> None:
        admission = Admission(slots=2, max_queue=5, max_wait=10)
        await admission.acquire()
        await admission.acquire()
        assert admission.active == 2 and admission.depth == 0
        third = asyncio.ensure_future(admission.acquire())
        await _settle()
        assert not third.done() and admission.depth == 1
        admission.release(0.5)  # handed over: the slot stays counted
        await asyncio.wait_for(third, 1)
        assert admission.active == 2 and admission.depth == 0
        admission.release()
        admission.release()
        assert admission.active == 0
        await admission.acquire()  # free again: no waiting
        assert admission.active == 1

    _run(scenario())


def test_admission_is_fifo_without_barging() -> None:
    async def scenario() -> list[str]:
        admission = Admission(slots=1, max_queue=5, max_wait=10)
        order: list[str] = []

        async def request(name: str) -> None:
            await admission.acquire()
            order.append(name)

        await admission.acquire()
        tasks = []
        for name in ("a", "b", "c"):
            tasks.append(asyncio.ensure_future(request(name)))
            await _settle()
        assert admission.depth == 3
        admission.release()  # "a" is granted the slot but has not run yet ...
        late = asyncio.ensure_future(request("late"))  # ... and a newcomer must not take it
        await _settle()
        assert order == ["a"] and admission.depth == 3  # b, c, late
        for _ in range(3):
            admission.release()
            await _settle()
        await asyncio.gather(*tasks, late)
        assert admission.active == 1
        return order

    assert _run(scenario()) == ["a", "b", "c", "late"]


def test_admission_full_queue_rejects_at_once() -> None:
    async def scenario() -> None:
        admission = Admission(slots=1, max_queue=2, max_wait=10)
        await admission.acquire()
        waiting = [asyncio.ensure_future(admission.acquire()) for _ in range(2)]
        await _settle()
        started = time.monotonic()
        with pytest.raises(Rejected) as info:
            await admission.acquire()
        assert time.monotonic() - started < 1.0
        assert info.value.reason == "overloaded"
        assert isinstance(info.value.retry_after, int) and info.value.retry_after >= 1
        assert admission.depth == 2 and admission.active == 1
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        assert admission.depth == 0 and admission.active == 1

    _run(scenario())


def test_admission_without_queue() -> None:
    async def scenario() -> None:
        admission = Admission(slots=1, max_queue=0, max_wait=10)
        await admission.acquire()
        with pytest.raises(Rejected):
            await admission.acquire()
        admission.release()
        await admission.acquire()

    _run(scenario())


def test_admission_max_wait_rejects_and_leaves_the_queue() -> None:
    async def scenario() -> None:
        admission = Admission(slots=1, max_queue=2, max_wait=0.05)
        await admission.acquire()
        started = time.monotonic()
        with pytest.raises(Rejected) as info:
            await admission.acquire()
        assert time.monotonic() - started >= 0.04
        assert info.value.reason == "overloaded" and info.value.retry_after >= 1
        assert admission.depth == 0 and admission.active == 1
        admission.release()
        assert admission.active == 0

    _run(scenario())


def test_admission_cancelled_waiter_leaves_queue_without_leaking_a_slot() -> None:
    async def scenario() -> None:
        admission = Admission(slots=1, max_queue=2, max_wait=10)
        await admission.acquire()
        waiter = asyncio.ensure_future(admission.acquire())
        await _settle()
        assert admission.depth == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert admission.depth == 0
        admission.release()
        assert admission.active == 0  # nobody was handed the slot
        await asyncio.wait_for(admission.acquire(), 0.5)
        assert admission.active == 1

    _run(scenario())


def test_admission_cancel_just_after_handover_passes_the_slot_on() -> None:
    async def scenario() -> None:
        admission = Admission(slots=1, max_queue=2, max_wait=10)
        await admission.acquire()
        first = asyncio.ensure_future(admission.acquire())
        second = asyncio.ensure_future(admission.acquire())
        await _settle()
        admission.release()  # the slot goes to `first` ...
        first.cancel()  # ... which is cancelled before it runs
        await asyncio.gather(first, return_exceptions=True)
        assert first.cancelled()
        await asyncio.wait_for(second, 1)  # the slot was passed on, not lost
        assert admission.active == 1 and admission.depth == 0
        admission.release()
        assert admission.active == 0

    _run(scenario())


def test_admission_retry_after_follows_service_time_and_depth() -> None:
    async def scenario() -> None:
        admission = Admission(slots=2, max_queue=10, max_wait=10)
        assert admission.retry_after() == 1
        await admission.acquire()
        await admission.acquire()
        admission.release(11.0)  # service average 1 -> 3 s
        await admission.acquire()
        waiting = [asyncio.ensure_future(admission.acquire()) for _ in range(3)]
        await _settle()
        assert admission.retry_after() == math.ceil(3.0 * 4 / 2)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    _run(scenario())


# --- header filtering ------------------------------------------------------------------------


def _h(*pairs: tuple[str, str]) -> list[tuple[bytes, bytes]]:
    return [(n.encode(), v.encode()) for n, v in pairs]


def test_request_headers_never_forward_credentials_or_hop_by_hop() -> None:
    incoming = _h(
        ("host", "gateway:8080"), ("authorization", "Bearer olk_secret"), ("x-api-key", "olk_secret"),
        ("cookie", "session=olk_secret"), ("proxy-authorization", "Basic c2VjcmV0"),
        ("connection", "keep-alive, X-Hop-Secret,  x-other-hop"), ("keep-alive", "timeout=5"),
        ("x-hop-secret", "olk_secret"), ("x-other-hop", "1"), ("te", "trailers"), ("trailer", "x-t"),
        ("transfer-encoding", "chunked"), ("upgrade", "h2c"), ("proxy-connection", "keep-alive"),
        ("content-length", "12"), ("expect", "100-continue"),
        ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), ("tracestate", "a=b"),
        ("content-type", "application/json"), ("x-sim-tokens", "3"), ("user-agent", "ua/1"),
        ("accept", "text/event-stream"),
    )
    out = request_headers(incoming, ("10.1.2.3", 5555), "https", None)
    names = [n for n, _ in out]
    assert names == ["content-type", "x-sim-tokens", "user-agent", "accept", "x-forwarded-for", "forwarded",
                     "x-forwarded-proto"]
    assert dict(out)["x-forwarded-for"] == "10.1.2.3" and dict(out)["x-forwarded-proto"] == "https"
    assert dict(out)["forwarded"] == "for=10.1.2.3;proto=https"
    assert not any("olk_secret" in v or "c2VjcmV0" in v for _, v in out)


def test_request_headers_upstream_key_replaces_the_callers() -> None:
    out = request_headers(_h(("authorization", "Bearer olk_caller")), None, "http", "runtime-key")
    assert out == [("forwarded", "proto=http"), ("x-forwarded-proto", "http"), ("authorization", "Bearer runtime-key")]


def test_request_headers_replace_every_forwarding_claim_of_the_caller() -> None:
    """What a proxy would say (address, host, URL, method) is the gateway's to say: a caller's
    claims are dropped, in any case and with "_" for "-", and the gateway's own are set."""
    from otel_llm.tools.gateway.header_rules import FORWARDING

    claims = [(name, "6.6.6.6") for name in sorted(FORWARDING)]
    claims += [("X_Forwarded_For", "6.6.6.6"), ("x-real_ip", "6.6.6.6"), ("X-HTTP-Method-Override", "DELETE")]
    incoming = [(n.lower().encode(), v.encode()) for n, v in claims] + _h(("content-type", "application/json"))
    out = request_headers(incoming, ("::1", 5555), "http", None)
    assert out == [("content-type", "application/json"), ("x-forwarded-for", "::1"),
                   ("forwarded", 'for="[::1]";proto=http'), ("x-forwarded-proto", "http")]


def test_response_headers_filtering() -> None:
    upstream = [(b"Content-Type", b"text/event-stream"), (b"Set-Cookie", b"sid=1"), (b"set-cookie", b"b=2"),
                (b"Connection", b"keep-alive, X-Internal"), (b"X-Internal", b"debug"),
                (b"Transfer-Encoding", b"chunked"), (b"Keep-Alive", b"timeout=5"),
                (b"Server-Timing", b"upstream;dur=1"), (b"X-Accel-Buffering", b"yes"), (b"x-request-id", b"r1")]
    out = response_headers(upstream, "auth;dur=0.1, total;dur=2")
    assert out == [(b"content-type", b"text/event-stream"), (b"x-request-id", b"r1"),
                   (b"x-accel-buffering", b"no"), (b"server-timing", b"auth;dur=0.1, total;dur=2")]


# --- command line ----------------------------------------------------------------------------


@pytest.fixture
def clean_gateway_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ENV_VARS.values():
        monkeypatch.delenv(variable, raising=False)


def _keygen(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, str]:
    assert main(["gateway", "keygen", *args]) == 0
    captured = capsys.readouterr()
    (key,) = _KEY_RE.findall(captured.err)
    return key, captured.out


def test_keygen_prints_hash_on_stdout_and_key_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       clean_gateway_env: None) -> None:
    key, out = _keygen(capsys, "alice", "--routes", "/v1/*")
    assert key not in out and key[len(KEY_PREFIX):] not in out
    table = tomllib.loads(out)["keys"]["alice"]
    assert table == {"hash": format_hash(key), "routes": ["/v1/*"]}
    keys = _keys_file(tmp_path, out)
    config = load_config({"upstream": UPSTREAM, "keys_file": str(keys)}, {})
    (policy,) = config.keys
    assert policy.key_id == "alice" and policy.routes == ("/v1/*",)
    assert KeyStore(config.keys).authenticate(key) is policy


def test_keygen_all_options_append_to_one_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               clean_gateway_env: None) -> None:
    key_a, out_a = _keygen(capsys, "alice")
    key_b, out_b = _keygen(capsys, "bob", "--routes", "/v1/chat/completions", "/api/*", "--models", "m1", "m2",
                           "--rate", "2.5", "--burst", "4", "--key-max-concurrency", "3")
    assert key_a != key_b
    keys = _keys_file(tmp_path, out_a + out_b)  # `>> keys.toml` twice
    store = KeyStore(load_config({"upstream": UPSTREAM, "keys_file": str(keys)}, {}).keys)
    alice, bob = store.authenticate(key_a), store.authenticate(key_b)
    assert alice.key_id == "alice" and alice.routes == ("*",) and alice.models is None
    assert (bob.routes, bob.models, bob.rate, bob.burst, bob.max_concurrency) == (
        ("/v1/chat/completions", "/api/*"), ("m1", "m2"), 2.5, 4, 3)


def test_keygen_id_with_a_dot_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          clean_gateway_env: None) -> None:
    """keygen accepts '.' in an ID, so what it prints for that ID must load as that one key."""
    key, out = _keygen(capsys, "team.alice")
    keys = _keys_file(tmp_path, out)
    config = load_config({"upstream": UPSTREAM, "keys_file": str(keys)}, {})
    assert [p.key_id for p in config.keys] == ["team.alice"]
    assert KeyStore(config.keys).authenticate(key).key_id == "team.alice"


@pytest.mark.parametrize("args", [[], ["bad id"], ["a" * 65], ["[keys]"], ['x"y']])
def test_keygen_rejects_missing_or_bad_id(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    assert main(["gateway", "keygen", *args]) == 2
    captured = capsys.readouterr()
    assert "give an ID" in captured.err
    assert captured.out == "" and not _KEY_RE.search(captured.err)  # no key was made


def test_cli_without_keys_exits_2(capsys: pytest.CaptureFixture[str], clean_gateway_env: None) -> None:
    assert main(["gateway", "--upstream", UPSTREAM, "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("otel-llm gateway: ") and "no API keys configured" in err and "keygen" in err


@pytest.mark.parametrize("upstream,words", [
    ("ftp://127.0.0.1:11434", ["upstream must be an http(s) URL"]),
    ("127.0.0.1:11434", ["upstream must be an http(s) URL"]),
    (None, ["upstream must be an http(s) URL"]),
    ("http://admin:hunter2@127.0.0.1:11434", ["must not carry credentials"]),
])
def test_cli_bad_upstream_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_gateway_env: None,
                                  upstream: str | None, words: list[str]) -> None:
    args = ["gateway", "--keys", str(_keys_file(tmp_path)), "--listen", "127.0.0.1:0"]
    args += ["--upstream", upstream] if upstream is not None else []
    assert main(args) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err
    assert "hunter2" not in err


def test_cli_bad_setting_from_environment_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch, clean_gateway_env: None) -> None:
    monkeypatch.setenv(ENV_VARS["max_queue"], "-3")
    args = ["gateway", "--keys", str(_keys_file(tmp_path)), "--upstream", UPSTREAM, "--listen", "127.0.0.1:0"]
    assert main(args) == 2
    assert "max_queue must be a non-negative number" in capsys.readouterr().err


def test_cli_non_numeric_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gateway", "--max-queue", "lots"]) == 2
    assert "--max-queue" in capsys.readouterr().err
