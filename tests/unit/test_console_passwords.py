"""Local console users' password hashes (scrypt, per-user salt), their settings and the
``radserve console hash-password`` command, and the per-client sign-in limiter."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

from radserve.cli import cli
from radserve.config import ConsoleSettings, ConsoleUser, Settings, load_settings
from radserve.console.limits import SignInLimiter
from radserve.console.users import LocalUsers
from radserve.errors import RadserveError
from radserve.passwords import PasswordHash, hash_password, verify_password
from radserve.store import init_store
from radserve.store.records import utc_now

SECRET = "correct horse battery"


def test_a_hash_verifies_its_password_only_and_each_has_its_own_salt() -> None:
    one, two = hash_password(SECRET), hash_password(SECRET)
    assert one != two  # fresh salt each time
    assert SECRET not in one
    parsed = PasswordHash.parse(one)
    assert (parsed.log2_n, parsed.r, parsed.p, len(parsed.salt)) == (15, 8, 1, 16)
    assert verify_password(SECRET, parsed)
    assert not verify_password(SECRET + " ", parsed)
    assert not verify_password("", parsed)
    assert not verify_password(SECRET, None)  # an unknown user: refused after the same work
    assert not verify_password("x" * 5000, parsed)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (SECRET, "never a clear password"),
        ("scrypt$15$8$1$abc", "expected scrypt$"),
        ("scrypt$15$8$1$!!$!!", "malformed"),
        ("scrypt$30$8$1$" + "A" * 24 + "$" + "A" * 44, "out of range"),
        ("scrypt$15$8$1$QUFB$" + "A" * 44, "too short"),
    ],
)
def test_a_setting_that_is_not_a_hash_is_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why.replace("$", r"\$")):
        ConsoleUser(username="alice", role="admin", password_hash=text)  # type: ignore[arg-type]


def test_console_users_need_valid_unique_names() -> None:
    encoded = hash_password(SECRET)
    with pytest.raises(ValidationError, match="unique"):
        ConsoleSettings(
            users=[  # type: ignore[list-item]
                {"username": "alice", "role": "admin", "password_hash": encoded},
                {"username": "Alice", "role": "read", "password_hash": encoded},
            ]
        )
    with pytest.raises(ValidationError, match="username"):
        ConsoleUser(username="al ice", role="read", password_hash=encoded)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="role"):
        ConsoleUser(username="alice", role="root", password_hash=encoded)  # type: ignore[arg-type]
    user = ConsoleUser(username="alice", role="read", password_hash=encoded)  # type: ignore[arg-type]
    assert encoded not in repr(user)  # a SecretStr: not shown by config show or logs


def test_hash_password_command_reads_stdin_and_prints_a_users_entry() -> None:
    runner = CliRunner()
    done = runner.invoke(cli, ["console", "hash-password", "--stdin"], input=SECRET + "\n")
    assert done.exit_code == 0, done.output
    assert SECRET not in done.output
    assert verify_password(SECRET, PasswordHash.parse(done.output.strip()))
    entry = runner.invoke(
        cli,
        ["console", "hash-password", "--stdin", "--username", "bob", "--role", "submit"],
        input=SECRET + "\n",
    )
    assert entry.exit_code == 0, entry.output
    users = ConsoleSettings(**yaml.safe_load(entry.output)["console"]).users
    assert (users[0].username, users[0].role) == ("bob", "submit")
    assert verify_password(SECRET, PasswordHash.parse(users[0].password_hash.get_secret_value()))
    short = runner.invoke(cli, ["console", "hash-password", "--stdin"], input="short\n")
    assert short.exit_code == 2 and "8 to 1024 characters" in short.output
    # at a terminal: asked twice, and a mismatch asks again
    asked = runner.invoke(
        cli, ["console", "hash-password"], input=f"{SECRET}\n{SECRET}x\n{SECRET}\n{SECRET}\n"
    )
    assert asked.exit_code == 0 and "do not match" in asked.output
    assert verify_password(SECRET, PasswordHash.parse(asked.output.strip().splitlines()[-1]))


def test_limiter_blocks_a_client_after_its_failures_until_they_leave_the_window(
    tmp_path: Path,
) -> None:
    base, now = utc_now(), [0.0]
    store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    limiter = SignInLimiter(
        store, max_failures=3, window_s=60, clock=lambda: base + dt.timedelta(seconds=now[0])
    )
    try:
        taken = [limiter.take("10.0.0.1") for _ in range(3)]
        assert [limiter.blocks(t) for t in taken] == [False, False, True]
        refused = limiter.take("10.0.0.1")
        assert refused.id is None and limiter.retry_after(refused) == 60
        assert limiter.take("10.0.0.2").id is not None  # another client is not affected
        now[0] = 59.0
        assert limiter.retry_after(limiter.take("10.0.0.1")) == pytest.approx(1.0)
        now[0] = 60.0
        again = limiter.take("10.0.0.1")  # the failures left the window
        assert again.id is not None and again.failures == 1  # counting starts again
        # a sliding window: failures at 60, 100 and 100 block until 120
        now[0] = 100.0
        limiter.take("10.0.0.1")
        assert limiter.blocks(limiter.take("10.0.0.1"))
        assert limiter.retry_after(limiter.take("10.0.0.1")) == pytest.approx(20.0)
    finally:
        store.close()


def test_a_clear_password_in_the_settings_file_is_refused_without_echoing_it(
    tmp_path: Path,
) -> None:
    config = tmp_path / "radserve.yaml"
    users = [{"username": "alice", "role": "admin", "password_hash": "hunter2-in-clear"}]
    config.write_text(yaml.safe_dump({"console": {"users": users}}))
    with pytest.raises(RadserveError) as caught:
        load_settings(config, data_dir=tmp_path / "data")
    assert "console.users.0.password_hash" in caught.value.message
    assert "hash-password" in caught.value.message
    assert "hunter2-in-clear" not in caught.value.message


def test_local_users_are_re_read_when_the_settings_file_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hashes = {n: hash_password(f"{n}-password-1") for n in ("alice", "bob")}
    config = tmp_path / "radserve.yaml"

    def write(*names: str, clear: str | None = None) -> None:
        users = [{"username": n, "role": "read", "password_hash": hashes[n]} for n in names]
        if clear is not None:
            users.append({"username": "carol", "role": "read", "password_hash": clear})
        config.write_text(yaml.safe_dump({"console": {"users": users}}))

    write("alice", "bob")
    loads: list[Path] = []

    def load(path: Path) -> Settings:
        loads.append(path)
        return load_settings(path, data_dir=tmp_path / "data")

    users = LocalUsers(load(config).console.users, config, load=load)
    assert [u.username for u in users.current()] == ["alice", "bob"]
    assert len(loads) == 1  # an unchanged file is not read again
    write("alice")
    assert [u.username for u in users.current()] == ["alice"]
    assert [u.username for u in users.current()] == ["alice"] and len(loads) == 2
    # a file that no longer loads keeps the users read before, and says why once
    write("alice", "bob", clear="hunter2-in-clear")
    with caplog.at_level(logging.ERROR, logger="radserve.console.users"):
        assert [u.username for u in users.current()] == ["alice"]
        assert [u.username for u in users.current()] == ["alice"]
    [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "console.users.2.password_hash" in error and "hunter2-in-clear" not in error
    config.unlink()  # gone: the users read before stay
    assert [u.username for u in users.current()] == ["alice"]
    write("bob")
    assert [u.username for u in users.current()] == ["bob"]
    # no settings file (the demo server): the users are fixed
    assert LocalUsers(users.current()).current() == users.current()
