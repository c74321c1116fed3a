"""The operator's CLI against a real SQLite store, as separate processes."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import openai

from tests.conftest import Stack


def router(*args: str, cwd: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_groups_and_keys_lifecycle(tmp_path) -> None:
    cwd = str(tmp_path)
    out = router("groups", "create", "team-a", "--credits", "12.5", cwd=cwd)
    assert out.returncode == 0, out.stderr
    assert "12.5 credits" in out.stdout
    assert (tmp_path / "data" / "router.db").exists()  # the default store lives under ./data
    dup = router("groups", "create", "team-a", "--credits", "1", cwd=cwd)
    assert dup.returncode != 0 and "already exists" in dup.stderr
    created = router("keys", "create", "--group", "team-a", "--name", "ci", cwd=cwd)
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"sk-mr-v1-[A-Za-z0-9_-]{43}", key)
    listing = router("keys", "list", cwd=cwd)
    assert "team-a" in listing.stdout and key not in listing.stdout and key[-4:] in listing.stdout
    db = (tmp_path / "data" / "router.db").read_bytes()
    assert key.encode() not in db  # only the hash is stored
    key_id = listing.stdout.strip().splitlines()[-1].split()[0]
    assert router("keys", "revoke", key_id, cwd=cwd).returncode == 0
    assert "revoked" in router("keys", "list", cwd=cwd).stdout
    again = router("keys", "revoke", key_id, cwd=cwd)
    assert again.returncode != 0
    missing = router("keys", "create", "--group", "nobody", cwd=cwd)
    assert missing.returncode != 0 and "no group named 'nobody'" in missing.stderr


def test_group_names_follow_the_consoles_rule(tmp_path) -> None:
    """One rule for group names everywhere: the CLI created 'a/b', which the console could not reach
    (a '/' in a path segment) and refused to create itself."""
    cwd = str(tmp_path)
    for bad in ("a/b", "_under", "sp ace", "x" * 65, "é"):
        out = router("groups", "create", bad, "--credits", "1", cwd=cwd)
        assert out.returncode != 0 and "A group name is 1 to 64" in out.stderr, (bad, out.stderr)
    assert "a/b" not in router("groups", "list", cwd=cwd).stdout
    assert router("groups", "create", "team.a_b-1", "--credits", "1", cwd=cwd).returncode == 0


def test_cli_and_gateway_share_the_store(stack: Stack, tmp_path) -> None:
    config = tmp_path / "router.toml"
    config.write_text(f'[store]\nurl = "{stack.settings.store.url}"\n')
    assert (
        router(
            "--config", str(config), "groups", "create", "shared", "--credits", "5", cwd=str(tmp_path)
        ).returncode
        == 0
    )
    created = router("--config", str(config), "keys", "create", "--group", "shared", cwd=str(tmp_path))
    key = created.stdout.strip().splitlines()[-1]
    client = stack.client(key)
    assert client.chat.completions.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
    ).choices
    key_id = (
        router("--config", str(config), "keys", "list", "--group", "shared", cwd=str(tmp_path))
        .stdout.splitlines()[-1]
        .split()[0]
    )
    router("--config", str(config), "keys", "revoke", key_id, cwd=str(tmp_path))
    stack.gateway.auth.forget()  # or wait auth_cache_seconds
    try:
        client.chat.completions.create(
            model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
        raise AssertionError("revoked key was accepted")
    except openai.AuthenticationError:
        pass


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser, str | None]]:
    """Every (sub)command under ``parser``: its words, its parser and the one-line help it is listed with."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                found.append(((*path, name), sub, listed.get(name)))
                found.extend(_commands(sub, (*path, name)))
    return found


def test_every_command_and_option_has_a_line_of_help() -> None:
    from cli.main import parser

    top = parser()
    commands = _commands(top)
    assert {
        "groups create",
        "groups topup",
        "groups list",
        "keys create",
        "keys revoke",
        "keys list",
        "console set-password",
    } <= {" ".join(words) for words, _, _ in commands}
    for words, sub, listed in commands:
        assert listed, f"router {' '.join(words)} is listed without help"
        assert sub.description, f"router {' '.join(words)} --help has no description"
        for action in sub._actions:
            if action.option_strings or not isinstance(action, argparse._SubParsersAction):
                assert action.help, (
                    f"router {' '.join(words)} {action.option_strings or action.dest}: no help"
                )
    shown = router("--help", cwd=".")
    assert "examples:" in shown.stdout and "router demo" in shown.stdout
    for command in ("serve", "demo"):
        text = router(command, "--help", cwd=".").stdout
        assert "--config PATH" in text and "CONFIG_SUB" not in text
