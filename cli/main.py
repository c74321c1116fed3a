"""The ``router`` command: serve, demo, and the operator's groups / keys commands.

    router serve [--config PATH] [--host H] [--port P] [--workers N]
    router demo [--port P] [--emulator-port P] [--new-key] [--access-log PATH|-]
    router groups create NAME --credits N | list | show NAME | topup NAME AMOUNT
    router keys create --group NAME [--name LABEL] [--spend-cap N] [--models a,b] [--expires WHEN]
                [--tags a,b] [--owner WHO] | list | show ID | revoke ID
    router keys update ID [--expires WHEN|never] [--tags a,b] [--owner WHO] | rotate ID [--grace 1h]
    router budgets add --group NAME [--key ID] --amount N --window day|week|month|12h | list | remove ID
    router usage [--group NAME] [--key ID] [--source api|job] [--limit N]
    router emulators [--host H] [--port P]     (the five emulated providers, for benchmarks)

Amounts are credits (decimals allowed). ``keys create`` prints the new key alone on its last line:
it is shown once and only its hash is stored.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from billing.backends import with_store
from billing.store import KeyInfo, KeyMeta, Store, StoreDown, StoreError
from console import lifecycle
from console.changes import cli_changes
from console.forms import Invalid
from core.catalog import ConfigError
from core.config import Settings, load_settings
from core.inputs import group_name_problem
from core.money import to_credits as nano_to_credits
from core.money import to_nano


def credits_to_nano(text: str) -> int:
    try:
        return to_nano(text)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


def _groups(args: argparse.Namespace, settings: Settings) -> None:
    if args.action == "create":
        problem = group_name_problem(args.name)  # the console's and the admin API's rule
        if problem is not None:
            raise SystemExit(f"error: {problem}")
        amount = credits_to_nano(args.credits)
        group = asyncio.run(
            with_store(settings.store.url, lambda s: cli_changes(s).create_group(args.name, amount))
        )
        print(f"group {group.name} (id {group.id}) created with {nano_to_credits(group.balance)} credits")
    elif args.action == "show":
        found = asyncio.run(with_store(settings.store.url, lambda s: s.get_group(args.name)))
        if found is None:
            raise SystemExit(f"error: no group named {args.name!r}")
        print(f"group     {found.name} (id {found.id})")
        print(f"balance   {nano_to_credits(found.balance)} credits")
        print(f"reserved  {nano_to_credits(found.reserved)} credits (calls in flight)")
        print(f"spent     {nano_to_credits(found.spent)} credits")
    elif args.action == "topup":
        amount = credits_to_nano(args.amount)
        group = asyncio.run(with_store(settings.store.url, lambda s: cli_changes(s).topup(args.name, amount)))
        print(f"group {group.name}: balance {nano_to_credits(group.balance)} credits")
    else:
        groups = asyncio.run(with_store(settings.store.url, lambda s: s.list_groups()))
        print(f"{'id':>4}  {'name':<24} {'balance':>16} {'reserved':>14} {'spent':>14}")
        for g in groups:
            print(
                f"{g.id:>4}  {g.name:<24} {nano_to_credits(g.balance):>16} {nano_to_credits(g.reserved):>14} {nano_to_credits(g.spent):>14}"
            )


def _when(ts: float | None) -> str:
    import datetime

    return (
        "-"
        if ts is None
        else datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    )


def _meta_args(args: argparse.Namespace) -> dict[str, Any]:
    """The lifecycle options given on the command line, as the admin API's fields."""
    given = {"expires_at": args.expires, "tags": args.tags, "owner": args.owner}
    return {name: value for name, value in given.items() if value is not None}


def _show_key(info: KeyInfo) -> None:
    print(
        f"key        {info.id} ({info.hint}) in group {info.group_name}, {'revoked' if info.revoked_at else 'live'}"
    )
    print(f"name       {info.name or '-'}")
    print(f"owner      {info.owner or '-'}")
    print(f"tags       {', '.join(info.tags) or '-'}")
    print(f"expires    {_when(info.expires_at)}")
    print(f"last used  {_when(info.last_used_at)}")
    print(f"spent      {nano_to_credits(info.spent)} credits")
    if info.rotated_until is not None:
        print(f"old secret valid until {_when(info.rotated_until)}")


def _keys(args: argparse.Namespace, settings: Settings) -> None:
    try:
        _key_action(args, settings)
    except Invalid as exc:
        raise SystemExit(f"error: {exc.message}") from None


def _key_action(args: argparse.Namespace, settings: Settings) -> None:
    url = settings.store.url
    if args.action == "create":
        cap = credits_to_nano(args.spend_cap) if args.spend_cap else None
        models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
        meta = lifecycle.meta_of(_meta_args(args))
        key, info = asyncio.run(
            with_store(
                url, lambda s: cli_changes(s).create_key(settings, args.group, args.name, cap, models, meta)
            )
        )
        print(f"key {info.id} created in group {info.group_name}; it is shown once, store it now:")
        print(key)
    elif args.action in ("show", "update"):

        async def show_or_update(store: Store) -> KeyInfo:
            info = await store.get_key(args.id)
            if info is None:
                raise StoreError(f"no key with id {args.id}")
            if args.action == "update":
                meta = lifecycle.meta_of(_meta_args(args), KeyMeta(info.expires_at, info.tags, info.owner))
                info = await cli_changes(store).update_key(
                    info, info.spend_cap, list(info.allowed_models or ()) or None, meta
                )
            return info

        _show_key(asyncio.run(with_store(url, show_or_update)))
    elif args.action == "rotate":
        grace = lifecycle.grace(args.grace, "--grace")

        async def rotate(store: Store) -> tuple[str, KeyInfo]:
            info = await store.get_key(args.id)
            if info is None:
                raise StoreError(f"no key with id {args.id}")
            return await cli_changes(store).rotate_key(settings, info, grace)

        key, info = asyncio.run(with_store(url, rotate))
        print(
            f"key {info.id} rotated; the old secret works until {_when(info.rotated_until)}; the new one is shown once:"
        )
        print(key)
    elif args.action == "revoke":
        done = asyncio.run(with_store(settings.store.url, lambda s: cli_changes(s).revoke_key(args.id)))
        if not done:
            raise SystemExit(f"error: no live key with id {args.id}")
        print(f"key {args.id} revoked")
    else:
        keys = asyncio.run(with_store(settings.store.url, lambda s: s.list_keys(args.group)))
        print(
            f"{'id':>4}  {'group':<16} {'name':<16} {'key':<22} {'status':<8} {'spent':>12}  {'expires':<20} {'last used':<20}"
        )
        for k in keys:
            status = "revoked" if k.revoked_at else "live"
            print(
                f"{k.id:>4}  {k.group_name:<16} {k.name:<16} {k.hint:<22} {status:<8} {nano_to_credits(k.spent):>12}  "
                f"{_when(k.expires_at):<20} {_when(k.last_used_at):<20}"
            )


def _webhooks(args: argparse.Namespace, settings: Settings) -> None:
    from billing.alerts import AlertBook
    from console import webhooks

    url = settings.store.url
    try:
        if args.action == "add":
            target = webhooks.url_of(args.url)
            below = webhooks.threshold_of(args.balance_below or None)
            within = webhooks.within_of(args.expiry_within or None)

            async def add(store: Store) -> Any:
                if args.group and await store.get_group(args.group) is None:
                    raise StoreError(f"no group named {args.group!r}")
                await webhooks.destination_of(target, settings.alerts.destinations())
                book = AlertBook(store.database)
                return await cli_changes(store).add_webhook(
                    book, target, args.group, below, within, not args.no_budgets
                )

            hook = asyncio.run(with_store(url, add))
            print(f"webhook {hook.id} added; its signing secret is shown once, store it now:")
            print(hook.secret)
            return
    except Invalid as exc:
        raise SystemExit(f"error: {exc.message}") from None
    if args.action == "remove":
        asyncio.run(with_store(url, lambda s: cli_changes(s).delete_webhook(AlertBook(s.database), args.id)))
        print(f"webhook {args.id} removed")
    elif args.action == "deliveries":
        rows = asyncio.run(
            with_store(url, lambda s: AlertBook(s.database).deliveries(args.webhook, args.limit))
        )
        print(
            f"{'id':>5}  {'created (UTC)':<20} {'hook':>4} {'event':<17} {'status':<10} {'tries':>5}  last error"
        )
        for d in rows:
            print(
                f"{d.id:>5}  {_when(d.created_at):<20} {d.webhook_id:>4} {d.event_type:<17} {d.status:<10} "
                f"{d.attempts:>5}  {d.error or ''}"
            )
    else:
        hooks = asyncio.run(with_store(url, lambda s: AlertBook(s.database).webhooks()))
        print(f"{'id':>4}  {'group':<16} {'balance under':>14} {'expiry within':>14} {'budgets':<8} url")
        for h in hooks:
            under = nano_to_credits(h.balance_below) if h.balance_below is not None else "-"
            soon = f"{h.expiry_within:.0f} s" if h.expiry_within is not None else "-"
            print(
                f"{h.id:>4}  {h.group or '(all)':<16} {under:>14} {soon:>14} {'yes' if h.budgets else 'no':<8} {h.url}"
            )


def _usage(args: argparse.Namespace, settings: Settings) -> None:
    import datetime

    records = asyncio.run(
        with_store(settings.store.url, lambda s: s.usage(args.group, args.key, args.source, args.limit))
    )
    print(
        f"{'time (UTC)':<19}  {'key':>4} {'source':<6} {'model':<34} {'in':>7} {'out':>7} {'credits':>14} {'status':<11}"
    )
    for r in records:
        when = datetime.datetime.fromtimestamp(r.ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
        status = r.status + ("" if r.usage_exact else "*")
        print(
            f"{when:<19}  {r.key_id:>4} {r.source:<6} {r.model:<34} {r.prompt_tokens:>7} {r.completion_tokens:>7} "
            f"{nano_to_credits(r.credits):>14} {status:<11}"
        )
    if any(not r.usage_exact for r in records):
        print(
            "* token counts estimated (the provider never reported usage, e.g. a stream the caller broke off)"
        )


EXAMPLES = """\
examples:
  router demo                                  gateway + emulated providers, a seeded key, on :8080
  router serve --config router.toml            the gateway alone
  router groups create acme --credits 500      a credit group
  router keys create --group acme --name ci    an API key (printed once)
  router usage --group acme --limit 20         the latest usage records
  router COMMAND --help                        one command's options
"""


def _meta_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--expires",
        metavar="WHEN",
        help="expiry: a duration from now (30d, 12h), an ISO 8601 date or time (UTC), or never",
    )
    p.add_argument("--tags", help="comma-separated tags (replace the key's tags)")
    p.add_argument("--owner", help="who the key belongs to (free text)")


def _config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        dest="config_sub",
        metavar="PATH",
        help="TOML settings file (default: $ROUTER_CONFIG, else built-in defaults)",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="router",
        description="OpenAI-compatible multi-provider model router",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        metavar="PATH",
        help="TOML settings file (default: $ROUTER_CONFIG, else built-in defaults)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the gateway", description="Run the gateway (hypercorn).")
    _config_option(serve)
    serve.add_argument("--host", help="address to listen on (default: [server] host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default: [server] port, 8080)")
    serve.add_argument("--workers", type=int, help="processes sharing the port (default: [server] workers)")
    serve.add_argument("--fd", type=int, help=argparse.SUPPRESS)  # a worker: serve this inherited socket
    serve.add_argument("--console-fd", type=int, help=argparse.SUPPRESS)  # and this one: [console] listen

    demo = sub.add_parser(
        "demo",
        help="run the gateway with emulated providers and a seeded key",
        description="The gateway and the emulated providers (openai/ with three deployments) in one process, with a "
        "group 'demo', its key and a console password kept in the data directory.",
    )
    _config_option(demo)
    demo.add_argument(
        "--host", default="127.0.0.1", help="address of the gateway and the emulators (default: %(default)s)"
    )
    demo.add_argument("--port", type=int, default=8080, help="the gateway's port (default: %(default)s)")
    demo.add_argument(
        "--emulator-port",
        type=int,
        default=0,
        metavar="PORT",
        help="first of the emulators' seven consecutive ports (default: free ports)",
    )
    demo.add_argument(
        "--new-key",
        action="store_true",
        help="issue a new demo key instead of reusing the one kept in the data directory",
    )
    demo.add_argument(
        "--access-log",
        default="",
        metavar="PATH",
        help="where the access log goes (default: access.log in the data directory; - for this terminal)",
    )

    emus = sub.add_parser(
        "emulators",
        help="run the five emulated providers alone (for benchmarks)",
        description="The five emulated providers, each on its own port, until Ctrl-C.",
    )
    emus.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    emus.add_argument(
        "--port",
        type=int,
        default=9100,
        help="first port; the providers take consecutive ports (default: %(default)s)",
    )

    groups = sub.add_parser(
        "groups",
        help="credit groups: create, top up, list, show",
        description="Credit groups: every key spends from its group's balance.",
    )
    gsub = groups.add_subparsers(dest="action", required=True, metavar="ACTION")
    gc = gsub.add_parser(
        "create", help="a new group with a starting balance", description="Create a credit group."
    )
    gc.add_argument("name", help="the group's name (unique)")
    gc.add_argument("--credits", required=True, help="starting balance in credits (up to 9 decimals)")
    gt = gsub.add_parser(
        "topup", help="add credits to a group's balance", description="Add credits to a group."
    )
    gt.add_argument("name", help="the group's name")
    gt.add_argument("amount", help="credits to add (up to 9 decimals)")
    gsub.add_parser(
        "list",
        help="every group with its balance, reserved and spent credits",
        description="List every group.",
    )
    gs = gsub.add_parser(
        "show", help="balance, reserved and spent credits of a group", description="Show one group."
    )
    gs.add_argument("name", help="the group's name")

    keys = sub.add_parser(
        "keys", help="API keys: create, list, revoke", description="API keys of the groups."
    )
    ksub = keys.add_subparsers(dest="action", required=True, metavar="ACTION")
    kc = ksub.add_parser(
        "create",
        help="issue a key (printed once, alone on the last line)",
        description="Issue an API key; only its hash is stored, so it is shown once.",
    )
    kc.add_argument("--group", required=True, help="the group the key spends from")
    kc.add_argument("--name", default="", help="a label for the key")
    kc.add_argument("--spend-cap", metavar="CREDITS", help="credits this key may spend in all")
    kc.add_argument("--models", help="comma-separated model ids this key may use (default: all)")
    _meta_options(kc)
    ku = ksub.add_parser(
        "update", help="change a key's expiry, tags or owner", description="Change a key's lifecycle fields."
    )
    ku.add_argument("id", type=int, help="the key's id (router keys list)")
    _meta_options(ku)
    ks = ksub.add_parser("show", help="a key's expiry, tags, owner, last use", description="Show one key.")
    ks.add_argument("id", type=int, help="the key's id (router keys list)")
    kt = ksub.add_parser(
        "rotate",
        help="a new secret for a key (printed once); the old one works for --grace",
        description="Rotate a key's secret: same key id, spend and settings; the old secret stays "
        "valid for the grace period, then gets 401 key_rotated.",
    )
    kt.add_argument("id", type=int, help="the key's id (router keys list)")
    kt.add_argument(
        "--grace",
        default="0",
        help="how long the old secret keeps working: seconds or 15m, 1h, 7d (default: 0)",
    )
    kr = ksub.add_parser(
        "revoke", help="revoke a key at once", description="Revoke a key; its next call gets 401."
    )
    kr.add_argument("id", type=int, help="the key's id (router keys list)")
    kl = ksub.add_parser("list", help="keys with their hint, status and spend", description="List keys.")
    kl.add_argument("--group", help="only this group's keys")

    hooks = sub.add_parser(
        "webhooks",
        help="alert webhooks: add, list, remove, deliveries",
        description="Webhooks alerted on thresholds (signed; retried from a durable outbox).",
    )
    hsub = hooks.add_subparsers(dest="action", required=True, metavar="ACTION")
    ha = hsub.add_parser(
        "add",
        help="a webhook (its signing secret printed once, alone on the last line)",
        description="Add a webhook: events are POSTed to URL, signed with its secret.",
    )
    ha.add_argument("url", help="where events are POSTed (http:// or https://)")
    ha.add_argument("--group", help="only this group's alerts (default: every group)")
    ha.add_argument(
        "--balance-below", metavar="CREDITS", help="alert when a group's balance drops under this"
    )
    ha.add_argument(
        "--expiry-within", metavar="WHEN", help="alert when a key expires within this (seconds, 12h, 7d)"
    )
    ha.add_argument("--no-budgets", action="store_true", help="no alerts at 50/80/100 %% of budget windows")
    hsub.add_parser("list", help="the webhooks and their thresholds", description="List the webhooks.")
    hr = hsub.add_parser("remove", help="stop alerting a webhook", description="Remove a webhook.")
    hr.add_argument("id", type=int, help="the webhook's id (router webhooks list)")
    hd = hsub.add_parser(
        "deliveries",
        help="the latest events and their delivery status",
        description="Events, newest first, with their delivery status.",
    )
    hd.add_argument("--webhook", type=int, help="only this webhook's events")
    hd.add_argument("--limit", type=int, default=50, help="how many events (default: %(default)s)")

    usage = sub.add_parser(
        "usage", help="usage records, newest first", description="Usage records, newest first."
    )
    usage.add_argument("--group", help="only this group's calls")
    usage.add_argument("--key", type=int, help="only this key's calls (its id)")
    usage.add_argument("--source", choices=["api", "job"], help="only API calls or only batch-job lines")
    usage.add_argument("--limit", type=int, default=50, help="how many records (default: %(default)s)")

    from cli.budgets import add_commands as add_budget_commands
    from cli.console import add_commands
    from cli.operators import add_commands as add_operator_commands

    add_budget_commands(sub)  # router budgets add | list | set | remove
    add_commands(sub)  # router console set-password | hash-password
    add_operator_commands(sub)  # router operators add | list | password | token | remove
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    config = getattr(args, "config_sub", None) or args.config
    try:
        settings = load_settings(config)
    except ConfigError as exc:
        raise SystemExit(f"config error: {exc}") from None
    try:
        if args.command == "serve":
            from cli.serve import main as serve_command

            serve_command(args, settings, config)
        elif args.command == "demo":
            from cli.demo import DemoError, DemoOptions, demo
            from server.serve import run

            options = DemoOptions(args.host, args.port, args.emulator_port, args.new_key, args.access_log)
            try:
                run(demo(settings, options))
            except DemoError as exc:
                raise SystemExit(f"router demo: {exc}") from None
        elif args.command == "emulators":
            from cli.demo import run_emulators_forever
            from server.serve import run

            run(run_emulators_forever(args.host, args.port))
        elif args.command == "groups":
            _groups(args, settings)
        elif args.command == "keys":
            _keys(args, settings)
        elif args.command == "usage":
            _usage(args, settings)
        elif args.command == "webhooks":
            _webhooks(args, settings)
        elif args.command == "budgets":
            from cli.budgets import run as budgets_command

            budgets_command(args, settings)
        elif args.command == "console":
            from cli.console import run as console_command

            console_command(args, settings)
        elif args.command == "operators":
            from cli.operators import run as operators_command

            operators_command(args, settings)
    except (StoreError, StoreDown) as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
