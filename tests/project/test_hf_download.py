"""-hf USER/REPO[:QUANT]: the model comes from a Hugging Face endpoint through huggingface_hub.

The test machine has no internet, so a local HTTP server plays the Hub (HF_ENDPOINT): the
tree listing (/api/models/REPO/tree/main) and the resolve URLs with the headers
huggingface_hub needs (X-Repo-Commit, ETag, Content-Length), serving the default model."""

import http.server
import json
import os
import re
import sys
import threading

import httpx
import pytest

from tests.helpers import THREADS, warmslot_server

pytestmark = [pytest.mark.model, pytest.mark.server]

REPO = "test-org/gemma-GGUF"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_test_token"
WARMSLOT = [sys.executable, "-m", "warmslot.server"]  # no -m MODEL: -hf names it


class FakeHub(http.server.ThreadingHTTPServer):
    """The Hub's file layout for one repository, with the requests it saw."""

    def __init__(self, files: dict[str, str | bytes]) -> None:
        super().__init__(("127.0.0.1", 0), _HubHandler)
        self.files = files  # name -> a path to serve, or the bytes
        self.seen: list[tuple[str, str, str]] = []  # (method, path, authorization)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def size(self, name: str) -> int:
        body = self.files[name]
        return len(body) if isinstance(body, bytes) else os.path.getsize(body)

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _HubHandler(http.server.BaseHTTPRequestHandler):
    server: FakeHub

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        hub = self.server
        hub.seen.append((self.command, self.path, self.headers.get("authorization", "")))
        path = self.path.split("?")[0]
        if path == f"/api/models/{REPO}/tree/main":
            listing = [{"type": "file", "path": name, "size": hub.size(name), "oid": f"{i:040x}"} for i, name in enumerate(hub.files)]
            return self._send(200, json.dumps(listing).encode(), {"Content-Type": "application/json"}, body)
        match = re.fullmatch(rf"/{REPO}/resolve/(main|{COMMIT})/(.+)", path)
        if not match or match.group(2) not in hub.files:
            return self._send(404, b"{}", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT}, body)
        name = match.group(2)
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{abs(hash(name)):064x}"'[:66] + '"',
                   "Content-Type": "application/octet-stream"}
        content = hub.files[name]
        if not body:
            return self._send(200, b"", {**headers, "Content-Length": str(hub.size(name))}, False)
        data = content if isinstance(content, bytes) else open(content, "rb").read()
        self._send(200, data, headers, True)

    def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


@pytest.fixture()
def hub(tiny_models, tmp_path):
    from tests.tiny_models import write_tiny_mmproj

    # a tiny model and a projector of its width: what is tested is the download, not the model
    mmproj = write_tiny_mmproj(tmp_path / "mmproj.gguf")
    server = FakeHub({
        "README.md": b"# test\n",
        "mmproj-gemma-F32.gguf": b"not this precision",
        "mmproj-gemma-F16.gguf": str(mmproj),  # the nearest to Q4_K_M's bits
        "vision/mmproj-gemma-Q4_K_M.gguf": b"not in the model's folder",
        "gemma-Q8_0.gguf": b"not this quant",
        "gemma-Q4_K_M.gguf": str(tiny_models["attention"]),
    })
    yield server
    server.stop()


def test_hf_repo_downloads_into_the_hub_cache_and_serves(hub, tmp_path):
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": TOKEN, "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    proc = warmslot_server_hf(env, "-hf", REPO)
    try:
        props = httpx.get(proc.url + "/props").json()
        r = httpx.post(proc.url + "/v1/completions", json={"prompt": "The sea", "max_tokens": 4, "temperature": 0}, timeout=120)
        models = httpx.get(proc.url + "/v1/models").json()["data"]
        by_id = httpx.get(f"{proc.url}/v1/models/{REPO}")  # an id with a slash
    finally:
        proc.stop()
    assert props["model_path"].startswith(str(tmp_path / "hf" / "hub"))
    assert props["model_path"].endswith("gemma-Q4_K_M.gguf")  # the default quant; never the projector
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert models[0]["id"] == REPO  # named like llama-server names a downloaded model
    assert by_id.status_code == 200 and by_id.json()["id"] == REPO
    downloads = [(m, p) for m, p, _ in hub.seen if "/resolve/" in p]
    assert ("GET", f"/{REPO}/resolve/main/gemma-Q4_K_M.gguf") in downloads or any(
        m == "GET" and p.endswith("gemma-Q4_K_M.gguf") for m, p in downloads)
    assert not any("Q8_0" in p or "F32" in p or "vision/" in p for _, p in downloads)
    # the repository's projector came beside the model, as llama-server's -hf fetches it
    assert any(p.endswith("mmproj-gemma-F16.gguf") for _, p in downloads)
    assert props["modalities"]["vision"] is True
    assert all(auth == f"Bearer {TOKEN}" for _, _, auth in hub.seen)  # HF_TOKEN on every request

    # the Hub is gone: the cached file is used, nothing is downloaded again; --no-mmproj
    # leaves the projector
    hub.stop()
    proc = warmslot_server_hf(env, "-hf", f"{REPO}:Q4_K_M", "--no-mmproj")
    try:
        again = httpx.get(proc.url + "/props").json()
    finally:
        proc.stop()
    assert again["model_path"] == props["model_path"] and again["modalities"]["vision"] is False


def test_the_projector_is_the_nearest_mmproj_of_the_closest_precision():
    from warmslot.server.process.hub import choose_projector

    files = ["m/model-Q4_K_M.gguf", "m/mmproj-F16.gguf", "m/mmproj-F32.gguf", "mmproj-Q4_0.gguf", "n/mmproj-Q4_0.gguf"]
    assert choose_projector(files, "m/model-Q4_K_M.gguf") == "m/mmproj-F16.gguf"  # its own folder first
    assert choose_projector(files, "m/model-F32.gguf") == "m/mmproj-F32.gguf"
    assert choose_projector(["model-Q8_0.gguf", "mmproj-Q4_0.gguf", "mmproj-Q8_0.gguf"], "model-Q8_0.gguf") == "mmproj-Q8_0.gguf"
    assert choose_projector(files, "x/model-Q4_K_M.gguf") == "mmproj-Q4_0.gguf"  # a folder above it
    assert choose_projector(["model.gguf", "n/mmproj-F16.gguf"], "model.gguf") is None


def test_an_unknown_quant_fails_with_the_choices(hub, tmp_path):
    import subprocess

    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run([*WARMSLOT, "-hf", f"{REPO}:Q2_K", "--port", "0"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "Q2_K" in done.stderr and "gemma-Q4_K_M.gguf" in done.stderr


def warmslot_server_hf(env: dict[str, str], *args: str):
    """A warmslot server whose model comes from -hf (no -m)."""
    from scripts.server_process import ServerProcess

    return ServerProcess("warmslot-hf", [*WARMSLOT, "-t", str(THREADS), "-np", "1", "-c", "1024", *args], env=env, ready_timeout=180)


def test_hub_retry_warnings_print_once():
    """huggingface_hub's loggers have a handler of their own and propagate to the root one:
    under the server's logging each retry warning printed twice."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent('''
        import logging, sys
        logging.basicConfig(stream=sys.stderr, format="%(message)s")
        import huggingface_hub
        from warmslot.server.process import hub

        def unreachable(repo, token):
            from huggingface_hub.utils import _http  # where the retries are logged

            _http.logger.warning("Retrying in 1s [Retry 1/5].")
            raise hub.HubError("offline")

        hub._repo_files = unreachable
        try:
            hub.download("org/repo:Q4_K_M")
        except hub.HubError:
            pass
    ''')
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stderr.count("Retrying in 1s") == 1, done.stderr
