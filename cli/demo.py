"""``router demo``: the emulated providers and the gateway in one process, with a seeded key.

Data lives in the default store under the working directory, so ``router keys ...`` and ``router
groups ...`` run from the same directory act on the demo's group and keys. The demo's key and its
console password are kept beside the database (``demo-key``, ``demo-console-password``, mode 0600)
and shown again by the next demo from the same directory.

Startup is ordered so that a failed start creates nothing and says why in one line
(:class:`DemoError`): the key's form, the gateway's port, the emulators' ports, the data directory
(one gateway per SQLite file), and only then the group, the key and the console password. The banner
is printed once the gateway answers on its port.
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import socket
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import msgspec

from billing.sqlite import sqlite_path
from billing.store import Store, StoreError
from cli.console import store_password
from cli.serve import reload
from console import auth
from console.queries import queries_for
from core.catalog import NANO
from core.config import ProviderSettings, Settings
from core.deployments import DeploymentSettings
from emulators.azure import AzureOpenAIEmulator
from emulators.registry import DEPLOYMENTS, FACTORIES, Running, banner_line, start_emulators, stop_emulators
from gateway.auth import generate_key, hash_key, key_form, new_key
from router.app import create_app
from server.serve import serve

DEMO_GROUP = "demo"
DEMO_CREDITS = 1_000 * NANO
KEY_FILE = "demo-key"
PASSWORD_FILE = "demo-console-password"  # noqa: S105 (a file name, not a password)
ACCESS_LOG = "access.log"


class DemoError(Exception):
    """Why the demo did not start, in one line. Nothing was created."""


@dataclass
class DemoOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    emulator_port: int = 0  # the first of the emulators' consecutive ports; 0: free ones
    new_key: bool = False  # a new demo key instead of the one kept in the data directory
    access_log: str = ""  # "": <data>/access.log; "-": the terminal (stderr)


def with_emulators(settings: Settings, running: dict[str, Running]) -> Settings:
    """``settings`` with every provider group served by its emulator, except the groups whose
    deployments the settings list (they say where each one is)."""
    providers = dict(settings.providers)
    for prefix, item in running.items():
        if item.name != item.prefix:
            continue  # another deployment of a group (demo_deployments)
        own = providers.get(prefix)
        if own is not None and own.deployments:
            continue
        if own is not None:
            providers[prefix] = msgspec.structs.replace(own, base_url=item.base_url, api_key=item.api_key)
        else:
            providers[prefix] = ProviderSettings(base_url=item.base_url, api_key=item.api_key)
    return msgspec.structs.replace(settings, providers=providers)


def demo_deployments(settings: Settings, running: dict[str, Running]) -> Settings:
    """openai/ served by three deployments of its emulators, each with its own key: the group's own
    emulator, ``second`` (60 requests a minute, then 429s) and an Azure OpenAI resource."""
    extra = [r for r in running.values() if r.name != r.prefix and r.prefix == "openai"]
    if not extra:
        return settings
    main = running["openai"]
    items = [DeploymentSettings(name="primary", base_url=main.base_url, api_key=main.api_key, weight=2)]
    for item in extra:
        azure = isinstance(item.emulator, AzureOpenAIEmulator)
        items.append(
            DeploymentSettings(
                name=item.name,
                base_url=item.base_url,
                api_key=item.api_key,
                kind="azure" if azure else None,
                api_version="2024-10-21" if azure else None,
                rpm=60 if item.name == "second" else 0,
            )
        )
    own = msgspec.structs.replace(
        settings.providers.get("openai", ProviderSettings()), base_url=None, api_key=None, deployments=items
    )
    return msgspec.structs.replace(settings, providers={**settings.providers, "openai": own})


def data_dir(settings: Settings) -> Path:
    """Where the demo keeps its files: beside the SQLite database (``./data`` otherwise)."""
    url = settings.store.url
    return Path(sqlite_path(url)).parent if url.startswith("sqlite:") else Path("data")


def fixed_key(settings: Settings) -> str | None:
    """``ROUTER_DEMO_KEY``, when set, checked for the key's form before anything starts."""
    fixed = os.environ.get("ROUTER_DEMO_KEY", "")
    if not fixed:
        return None
    prefix = settings.server.key_prefix
    if not key_form(prefix).match(fixed):
        raise DemoError(
            f"ROUTER_DEMO_KEY does not have the form of a key: '{prefix}-v1-' then 32 to 128 of "
            f"A-Z a-z 0-9 _ - (e.g. {generate_key(prefix)}); unset it for a generated key"
        )
    return fixed


def bind(host: str, port: int) -> socket.socket:
    """The gateway's listening socket, bound before anything else starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=4096)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise DemoError(
                f"port {port} on {host} is in use: stop what serves there, or choose another "
                f"port: make demo PORT={port + 1} (router demo --port {port + 1})"
            ) from None
        raise DemoError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


async def emulators(host: str, first_port: int) -> dict[str, Running]:
    try:
        return await start_emulators(host, first_port, deployments=True)
    except OSError as exc:
        last = first_port + len(FACTORIES) + len(DEPLOYMENTS) - 1
        why = "one is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise DemoError(
            f"the emulators' ports {first_port}-{last} on {host} are not all free ({why}): choose "
            "others: make demo EMULATOR_PORT=N (router demo --emulator-port N)"
        ) from None


def keep(path: Path, secret: str) -> None:
    """A secret the next demo shows again, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secret + "\n")


def kept(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


async def demo_key(store: Store, settings: Settings, directory: Path, fixed: str | None, fresh: bool) -> str:
    """The demo group, and its key: ``ROUTER_DEMO_KEY``'s, else the one kept in the data directory
    while it is live (unless ``fresh``), else a new one, kept for the next demo."""
    if await store.get_group(DEMO_GROUP) is None:
        await store.create_group(DEMO_GROUP, DEMO_CREDITS)
    if fixed is not None:
        if await store.principal(hash_key(fixed)) is None:
            try:
                await new_key(store, settings, DEMO_GROUP, "demo", key=fixed)
            except Exception as exc:  # noqa: BLE001 - a revoked key's hash is taken: say so in one line
                raise DemoError(
                    f"ROUTER_DEMO_KEY cannot be used ({exc}): a revoked key is not revived"
                ) from None
        return fixed
    path = directory / KEY_FILE
    old = None if fresh else kept(path)
    if old is not None and key_form(settings.server.key_prefix).match(old):
        principal = await store.principal(hash_key(old))
        if principal is not None and principal.group_name == DEMO_GROUP:
            return old
    key, _ = await new_key(store, settings, DEMO_GROUP, "demo")
    keep(path, key)
    return key


async def console_sign_in(store: Store, settings: Settings, directory: Path) -> str:
    """How to sign in to the console. With no password anywhere, the demo sets one (once) and keeps it
    in the data directory; a password set since with ``router console set-password`` is not shown."""
    if not settings.console.enabled:
        return "off ([console] enabled = false)"
    if settings.console.password_hash:
        return "sign in with the password whose hash is [console] password_hash"
    stored = await queries_for(store).get_setting(auth.PASSWORD_SETTING)
    path = directory / PASSWORD_FILE
    password = kept(path)
    if not stored:
        password = secrets.token_urlsafe(12)
        await store_password(store, auth.hash_password(password))
        keep(path, password)
    elif password is None or not await asyncio.to_thread(auth.verify_password, password, stored):
        return "sign in with the password set by `router console set-password` (run it again to change it)"
    return f"password {password}  (kept in {path}; `router console set-password` changes it)"


def demo_settings(settings: Settings, directory: Path, access_log: str) -> Settings:
    """The access log goes to a file in the data directory, not to the banner's terminal."""
    obs = settings.observability
    if access_log == "-" or obs.access_log_file or not obs.access_log:
        return settings
    path = access_log or str(directory / ACCESS_LOG)
    return msgspec.structs.replace(settings, observability=msgspec.structs.replace(obs, access_log_file=path))


def banner(
    base: str, running: dict[str, Running], key: str, directory: Path, console: str, access: str
) -> str:
    origin = base.removesuffix("/v1")

    def port(r: Running) -> str:
        return r.base_url.split(":")[-1].split("/")[0]

    providers = ", ".join(f"{p} :{port(r)}" for p, r in sorted(running.items()) if r.name == r.prefix)
    deployments = ", ".join(f"{r.name} :{port(r)}" for r in running.values() if r.name != r.prefix)
    return f"""
  Model router demo: gateway on {base}
  Emulated providers: {providers}
  openai/ deployments: primary (the openai emulator), {deployments or "none"}
  API key (group '{DEMO_GROUP}', kept in {directory / KEY_FILE}; make demo NEW_KEY=1 for another):
    {key}
  Console: {origin}/console
    {console}
  Access log: {access}

  Try it:
    curl {base}/chat/completions -H "Authorization: Bearer {key}" \\
         -H "Content-Type: application/json" \\
         -d '{{"model": "openai/gpt-4o-mini", "messages": [{{"role": "user", "content": "Hello"}}]}}'

    pip install openai      # in your own Python, then:
    python -c "from openai import OpenAI; c = OpenAI(base_url='{base}', api_key='{key}'); \\
print(c.chat.completions.create(model='mistral/mistral-small-latest', messages=[{{'role': 'user', 'content': 'Hi'}}]).choices[0].message.content)"
  Ctrl-C stops it.
"""


async def demo(settings: Settings, options: DemoOptions) -> None:
    """Run the demo until SIGINT/SIGTERM; :class:`DemoError` when it cannot start."""
    fixed = fixed_key(settings)
    directory = data_dir(settings)
    sock = bind(options.host, options.port)
    try:
        running = await emulators(options.host, options.emulator_port)
    except BaseException:
        sock.close()
        raise
    try:
        settings = demo_deployments(with_emulators(settings, running), running)
        settings = demo_settings(settings, directory, options.access_log)
        app = create_app(settings)
        gateway = app.state.gateway
        try:
            await gateway.start()  # the store, and the data directory's lock (one gateway per SQLite file)
        except (StoreError, OSError) as exc:
            await gateway.store.close()
            raise DemoError(f"the data directory {directory}{os.sep} cannot be used: {exc}") from None
        try:
            key = await demo_key(gateway.store, settings, directory, fixed, options.new_key)
            console = await console_sign_in(gateway.store, settings, directory)
        except BaseException:
            await gateway.stop()
            raise
        access = settings.observability.access_log_file or (
            "on this terminal" if settings.observability.access_log else "off"
        )
        base = f"http://{options.host}:{options.port}/v1"

        async def started() -> None:
            print(banner(base, running, key, directory, console, access), flush=True)

        server = msgspec.structs.replace(settings.server, host=options.host, port=options.port)
        await serve(
            app,
            server,
            started,
            fd=sock.detach(),
            on_reload=partial(reload, gateway),
            console=app.state.console_listener,
        )
    finally:
        sock.close()
        await stop_emulators(running)


async def run_emulators_forever(host: str, first_port: int) -> None:
    running = await start_emulators(host, first_port)
    for item in running.values():
        print(banner_line(item), flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await stop_emulators(running)
