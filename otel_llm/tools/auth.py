"""``--auth-env``, shared by the commands that send requests to a server: the token is read from
the environment (never from the command line, where ``ps`` shows it), sent as a bearer token and
masked wherever a server might quote it back."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NamedTuple

__all__ = ["Auth", "add_auth_argument", "read_auth"]


class Auth(NamedTuple):
    secret: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"} if self.secret else {}

    def redact(self, text: str) -> str:
        """``text`` with the token masked (an error body may echo the caller's header)."""
        return text.replace(self.secret, "***") if self.secret else text


def add_auth_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--auth-env", metavar="VAR",
                        help="environment variable holding a token sent as 'Authorization: Bearer ...'")


def read_auth(args: argparse.Namespace, prog: str) -> Auth | None:
    """The token named by ``--auth-env``; None (after a message on stderr) when that variable is
    unset or empty, which the command refuses rather than sending unauthenticated requests."""
    if not args.auth_env:
        return Auth()
    secret = os.environ.get(args.auth_env)
    if not secret:
        print(f"{prog}: environment variable {args.auth_env} is not set or empty", file=sys.stderr)
        return None
    return Auth(secret)
