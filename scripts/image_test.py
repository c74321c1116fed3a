"""`make image-test`: the container image built and run here, where no registry is reachable.

1. a base image from Debian's packages (mmdebstrap: minbase, python3, python3-venv), imported with buildah;
2. the image from the Containerfile on that base (`buildah bud --isolation chroot --build-arg BASE=...`);
3. its SBOM (/app/sbom.cdx.json, CycloneDX) listing the venv's packages at uv.lock's versions;
4. run with `buildah run --isolation chroot` (the host's network): a group and a key made with the image's
   own CLI, then `router serve` on a free loopback port, configured by a mounted file, against the
   emulated providers on the host; a chat call and a stream through it with the openai SDK, and the
   health check's command; then SIGTERM while a slow stream is open: the stream finishes, the process
   exits 0.

Needs root, buildah and mmdebstrap (installed with apt when missing). Prints each step and its time;
exits non-zero on any failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "localhost/model-router-test"
BASE = "localhost/model-router-base"
MIRROR = "deb http://deb.debian.org/debian bookworm main"


def step(what: str) -> float:
    print(f"image-test: {what}", flush=True)
    return time.monotonic()


def run(*argv: str, timeout: float = 900, **kw: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise SystemExit(f"image-test: {' '.join(argv[:4])} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tools() -> None:
    missing = [name for name in ("buildah", "mmdebstrap") if shutil.which(name) is None]
    if missing:
        if os.geteuid() != 0:
            raise SystemExit(f"image-test needs {' '.join(missing)}: run  sudo apt-get install -y {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if subprocess.run(["apt-get", "install", "-y", *missing], capture_output=True, env=env, check=False).returncode:
            run("apt-get", "update", env=env)
            run("apt-get", "install", "-y", *missing, env=env)


def base(tmp: Path) -> None:
    began = step("a base image from Debian's packages (mmdebstrap)")
    tarball = tmp / "base.tar"
    run("mmdebstrap", "--quiet", "--variant=minbase", "--include=python3,python3-venv,ca-certificates,passwd",
        "--format=tar", "bookworm", str(tarball), MIRROR)  # fmt: skip
    ctr = run("buildah", "from", "scratch").stdout.strip()
    try:
        run("buildah", "add", ctr, str(tarball), "/")
        run("buildah", "config", "--env", "LANG=C.UTF-8", ctr)
        run("buildah", "commit", "--quiet", ctr, BASE)
    finally:
        run("buildah", "rm", ctr)
    print(f"image-test:   {time.monotonic() - began:.0f} s", flush=True)


def build() -> None:
    began = step("the image (buildah bud --isolation chroot)")
    trusted = []  # the CA bundle this machine's downloads trust (a proxy's included), for the build's
    bundle = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt"
    if Path(bundle).is_file():
        trusted = ["--volume", f"{bundle}:/run/host-ca.crt:ro", "--build-arg", "CA_BUNDLE=/run/host-ca.crt"]
    run("buildah", "bud", "--quiet", "--isolation", "chroot", "--format", "docker", "--build-arg", f"BASE={BASE}",
        *trusted, "-f", str(ROOT / "Containerfile"), "-t", IMAGE, str(ROOT))  # fmt: skip
    print(f"image-test:   {time.monotonic() - began:.0f} s", flush=True)


def sbom() -> None:
    """The image's /app/sbom.cdx.json: CycloneDX JSON listing the venv's packages at uv.lock's versions."""
    import tomllib

    locked = {p["name"]: p["version"] for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}
    ctr = run("buildah", "from", IMAGE).stdout.strip()
    try:
        doc = json.loads(run("buildah", "run", "--isolation", "chroot", ctr, "--", "cat", "/app/sbom.cdx.json").stdout)
    finally:
        run("buildah", "rm", ctr)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"], doc.get("bomFormat")
    listed = {c["name"].lower(): c.get("version") for c in doc["components"]}
    for name in ("starlette", "msgspec", "hypercorn", "aiohttp", "cryptography"):
        assert listed.get(name) == locked[name], (name, listed.get(name), locked[name])
    assert "cyclonedx-bom" not in listed  # the tool ran beside the image's venv, not in it
    print(f"image-test:   the SBOM lists {len(listed)} packages at their locked versions", flush=True)


def emulators() -> tuple[subprocess.Popen[str], dict[str, str]]:
    first = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cli", "emulators", "--port", str(first)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    assert proc.stdout is not None
    from emulators.registry import FACTORIES, read_banner

    urls = {prefix: url for prefix, (url, _) in read_banner(proc.stdout).items()}
    if len(urls) == len(FACTORIES):
        return proc, urls
    raise SystemExit("image-test: the emulators did not start")


def serve(tmp: Path, urls: dict[str, str]) -> None:
    began = step("run it (buildah run --isolation chroot) against the emulators")
    import openai

    port = free_port()
    config = tmp / "config"
    config.mkdir()
    lines = ["[server]", "graceful_timeout = 20.0", ""]
    for prefix, url in urls.items():
        lines += [f"[providers.{prefix}]", f'base_url = "{url}"', f'api_key = "emu-{prefix}-key"', ""]
    (config / "router.toml").write_text("\n".join(lines))
    ctr = run("buildah", "from", IMAGE).stdout.strip()
    inside = ["buildah", "run", "--isolation", "chroot", "--user", "router", "--env", "ROUTER_CONFIG=/etc/router/router.toml",
              "--volume", f"{config}:/etc/router:ro", ctr, "--"]  # fmt: skip
    try:
        run(*inside, "/app/.venv/bin/router", "groups", "create", "image", "--credits", "100")
        key = run(*inside, "/app/.venv/bin/router", "keys", "create", "--group", "image", "--name", "k").stdout.strip().splitlines()[-1]
        server = subprocess.Popen([*inside, "/app/.venv/bin/router", "serve", "--host", "127.0.0.1", "--port", str(port)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        out: list[str] = []
        threading.Thread(target=lambda: out.extend(server.stdout or ()), daemon=True).start()
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("image-test: router serve did not start in the container:\n" + "".join(out)) from None
                time.sleep(0.3)
        health = json.loads(run("buildah", "inspect", "--type", "image", IMAGE).stdout)
        check = health["Docker"]["config"]["Healthcheck"]["Test"]
        run(*inside, *[c.replace("8080", str(port)) for c in check[1:]])  # the image's own health check
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
        answer = client.chat.completions.create(model="anthropic/claude-haiku-4-5", messages=[{"role": "user", "content": "Hello"}])
        assert answer.choices[0].message.content, answer
        chunks = list(client.chat.completions.create(model="google/gemini-2.5-flash", stream=True, stream_options={"include_usage": True},
                                                     messages=[{"role": "user", "content": "Hello"}]))  # fmt: skip
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        # SIGTERM while a slow stream is open: it finishes, then the process exits 0
        slow = client.chat.completions.create(model="openai/gpt-4o-mini", stream=True,
                                              messages=[{"role": "user", "content": "[tokens:30] [delay:100]"}])  # fmt: skip
        first = next(iter(slow))
        pids = run("pgrep", "-f", f"router serve --host 127.0.0.1 --port {port}").stdout.split()
        gateway = [int(pid) for pid in pids if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"buildah")]
        assert len(gateway) == 1, pids  # the gateway's process in the container (not buildah's own)
        os.kill(gateway[0], signal.SIGTERM)
        rest = list(slow)
        text = (first.choices[0].delta.content or "") + "".join(c.choices[0].delta.content or "" for c in rest if c.choices)
        assert len(text.split()) == 30, text
        assert server.wait(30) == 0, "".join(out)
        client.close()
    finally:
        run("buildah", "rm", ctr)
    print(f"image-test:   {time.monotonic() - began:.0f} s: a call, a stream and a drained stream through the image", flush=True)


def main() -> int:
    tools()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="image-test-") as name:
        tmp = Path(name)
        base(tmp)
        build()
        sbom()
        proc, urls = emulators()
        try:
            serve(tmp, urls)
        finally:
            proc.terminate()
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
    print(f"image-test: passed in {time.monotonic() - began:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
