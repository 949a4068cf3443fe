"""The in-flight table (otel_llm.telemetry.inflight): concurrency per server, retries and calls
after an unload, as seen when a call is admitted."""

from __future__ import annotations

import threading

from otel_llm.telemetry.inflight import Admission, InFlight

A = ("127.0.0.1", 11434)
B = ("127.0.0.1", 8080)
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


def admit(table: InFlight, server: tuple[str, int] = A, body: bytes | None = BODY, headers: object = None,
          model: str | None = "m", unloads: bool = False) -> Admission:
    return table.admit(server, body, {} if headers is None else headers, model, unloads)


def test_concurrency_counts_the_other_calls_to_the_same_server() -> None:
    table = InFlight()
    first = admit(table, body=b"1")
    second = admit(table, body=b"2")
    other = admit(table, B, body=b"3")
    assert (first.concurrent, second.concurrent, other.concurrent) == (0, 1, 0)
    assert table.by_server == {A: 2, B: 1}
    table.release(first)
    assert admit(table, body=b"4").concurrent == 1
    assert table.by_server == {A: 2, B: 1}


def test_a_released_server_stays_at_zero_and_never_goes_negative() -> None:
    """The active-requests metric keeps reporting a server once seen, at zero when idle."""
    table = InFlight()
    admission = admit(table)
    table.release(admission)
    table.release(admission)  # released twice: still zero, not -1
    assert table.by_server == {A: 0}


def test_a_byte_identical_body_in_flight_to_the_same_server_is_a_retry() -> None:
    table = InFlight()
    first = admit(table)
    assert not first.retry
    assert admit(table).retry
    assert not admit(table, B).retry  # the same body to another server: a different call
    assert not admit(table, body=BODY + b" ").retry


def test_a_body_is_a_retry_only_while_an_identical_one_is_in_flight() -> None:
    table = InFlight()
    first = admit(table)
    second = admit(table)
    table.release(first)
    assert admit(table).retry  # the second copy is still in flight
    table.release(second)
    assert admit(table).retry  # the third one (admitted just above) still is
    assert table._bodies == {(A, hash(BODY)): 2}


def test_every_identical_body_released_forgets_it() -> None:
    table = InFlight()
    copies = [admit(table) for _ in range(3)]
    for copy in copies:
        table.release(copy)
    assert not admit(table).retry


def test_empty_and_unread_bodies_are_never_retries() -> None:
    """A GET has b"", a streamed upload None: neither can identify a duplicate."""
    table = InFlight()
    for body in (b"", None, b"", None):
        admission = admit(table, body=body)
        assert admission.body_key is None and not admission.retry
    assert table.by_server == {A: 4}


def test_the_openai_sdk_retry_header_marks_a_retry() -> None:
    table = InFlight()
    assert admit(table, body=b"a", headers={"x-stainless-retry-count": "1"}).retry
    assert admit(table, body=b"b", headers={"x-stainless-retry-count": 2}).retry
    assert not admit(table, body=b"c", headers={"x-stainless-retry-count": "0"}).retry
    assert not admit(table, body=b"d", headers={}).retry


def test_an_unreadable_or_negative_retry_header_is_not_a_retry() -> None:
    table = InFlight()
    for index, value in enumerate(("one", "", "1.5", None, "-3", [1])):
        admission = admit(table, body=bytes([index + 1]), headers={"x-stainless-retry-count": value})
        assert not admission.retry, value


def test_a_call_after_an_unloading_request_is_a_cold_start_once() -> None:
    """Ollama's keep_alive: 0 unloads the model once the request ends: the next call to that
    model at that server loads it again; the one after that does not."""
    table = InFlight()
    unloading = admit(table, body=b"1", model="llama3", unloads=True)
    assert not unloading.after_unload
    assert not admit(table, body=b"2", model="qwen", unloads=False).after_unload  # another model
    assert not admit(table, B, body=b"3", model="llama3").after_unload  # another server
    assert admit(table, body=b"4", model="llama3").after_unload
    assert not admit(table, body=b"5", model="llama3").after_unload


def test_an_unloading_call_after_an_unload_is_cold_and_unloads_again() -> None:
    table = InFlight()
    admit(table, body=b"1", model=None, unloads=True)
    again = admit(table, body=b"2", model=None, unloads=True)
    assert again.after_unload
    assert admit(table, body=b"3", model=None).after_unload
    assert not admit(table, body=b"4", model=None).after_unload


def test_the_admission_records_what_release_needs() -> None:
    table = InFlight()
    admission = admit(table, B, body=b"payload")
    assert admission.server == B
    assert admission.body_key == hash(b"payload")


def test_counts_stay_exact_under_concurrent_admissions() -> None:
    table = InFlight()
    threads, per_thread = 8, 200

    def work(index: int) -> None:
        for n in range(per_thread):
            table.release(admit(table, body=f"{index}-{n}".encode()))

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert table.by_server == {A: 0}
    assert table._bodies == {}
