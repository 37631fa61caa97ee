"""The ``remote`` generation backend: samples come from generation servers started apart from the
run (``corerl serve-generation RECIPE --port N``, :mod:`corerl.run.generation_server`), over HTTP.

``policy.generation.remote.urls`` lists the servers; each takes every refit.
``policy.generation.remote.proxy_url``, when set, takes every generation request instead of the
servers (a load balancer in front of them: SkyRL's ``external_proxy_url``); otherwise a call's
prompts are spread over the servers, one contiguous share each, sent at once.

The protocol (JSON unless said otherwise; :mod:`corerl.run.generation_server` serves it):

- ``GET /info``: ``{"server_id", "version", "model", "fingerprint", "backend"}``;
- ``POST /generate`` ``{"prompts", "sampling", "n"}`` -> ``{"samples", "server_id", "version"}``;
  ``sampling`` is :class:`~corerl.generation.contract.SamplingSettings`' fields;
- ``POST /weights/{update}/{index}``: one chunk of a refit, a safetensors file as the body
  (``policy.generation.remote.weight_chunk_mb`` of tensors at most, a tensor larger than that alone);
- ``POST /weights/{update}/commit`` ``{"chunks"}``: the chunks loaded into the engine at once, between
  two generation calls, and the server's ``version`` counter stepped (-> ``{"version"}``);
- ``POST /reset``: the checkpoint's weights reloaded (a run starts from them; ``/info``'s
  ``checkpoint`` says whether a refit changed them since);
- ``POST /pause``, ``POST /resume``: hold new generation requests, and let them go.

No request mixes weights: a server runs generation calls and weight loads one at a time, in
order. Each answer names the server and its weights' version; an answer from weights older than
the last refit (a proxy routing to a server not in ``urls``) is refused in one line.

Only the standard library is imported here; torch and safetensors when weights are sent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from corerl.config.fields import setting
from corerl.errors import ConfigError, EngineNotAvailable, RunError
from corerl.generation.contract import Sample, SamplingSettings

log = logging.getLogger(__name__)

SECTION = "policy.generation.remote"
_START = "start one with `corerl serve-generation RECIPE --port N` (docs/generation-backends.md), or correct the URL"


@attrs.define(kw_only=True)
class RemoteConfig:
    """``policy.generation.remote``: generation servers started apart from the run."""

    urls: list[str] = setting([], help="the generation servers (http://host:port): each takes every refit and, "
                                       "without proxy_url, a share of every generation call")
    proxy_url: str | None = setting(None, help="where generation requests go instead of the servers (a load "
                                               "balancer in front of them); refits still go to each of urls")
    timeout_s: float = setting(600.0, min=0.0, min_exclusive=True,
                               help="how long one request to a server may take (a generation call, a weight chunk)")
    weight_chunk_mb: int = setting(256, min=1, help="the most tensor bytes (MiB) one weight chunk of a refit holds")


def check_remote_chosen(config: Any) -> None:
    """Refuse, in one line and without contacting anything, a remote backend with no server. The
    addresses themselves are checked when the run starts (:meth:`RemoteGenerationBackend.load_hf`):
    a recipe may be validated for another machine, where they are given later."""
    settings = config.section(SECTION)
    if not settings.urls and not settings.proxy_url:
        raise ConfigError("the remote generation backend has no server to send requests to",
                          key=f"{SECTION}.urls", hint="list the generation servers (policy.generation.remote."
                                                      "urls=[http://host:port]), started with `corerl "
                                                      "serve-generation RECIPE --port N` (docs/generation-backends.md)")


def check_addresses(urls: list[str], proxy: str | None) -> None:
    """Refuse, in one line, an address that is not an http(s) URL."""
    for key, url in [*((f"{SECTION}.urls", u) for u in urls), (f"{SECTION}.proxy_url", proxy)]:
        if url is not None and not str(url).startswith(("http://", "https://")):
            raise ConfigError(f"{url!r} is not an http:// or https:// URL", key=key,
                              hint="write the generation server's address as http://host:port")


def model_fingerprint(model_path: str, sample_bytes: int = 2**20) -> str:
    """What a trainer and a server compare to know they hold the same checkpoint, without reading
    all of its weights: its ``config.json``, the names and sizes of its weight files, and
    ``sample_bytes`` of each file at its start, middle and end (two trainings of one architecture
    differ there)."""
    folder = Path(model_path)
    digest = hashlib.sha256()
    config = folder / "config.json"
    digest.update(json.dumps(json.loads(config.read_text()), sort_keys=True).encode() if config.is_file() else b"")
    for f in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
        size = f.stat().st_size
        digest.update(f"{f.name}:{size}".encode())
        with f.open("rb") as weights:
            for offset in sorted({0, max(0, size // 2 - sample_bytes // 2), max(0, size - sample_bytes)}):
                weights.seek(offset)
                digest.update(weights.read(sample_bytes))
    return digest.hexdigest()[:16]


def call(url: str, path: str, body: Any = None, *, raw: bytes | None = None, timeout: float = 600.0,
         key: str = f"{SECTION}.urls") -> Any:
    """One request to a generation server: ``body`` as JSON (or ``raw`` bytes), the JSON answer
    back. An unreachable server is refused in one line naming it and ``key``; an error the server
    reports is raised with its line."""
    import urllib.error
    import urllib.request

    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    headers = {"Content-Type": "application/octet-stream" if raw is not None else "application/json"}
    request = urllib.request.Request(url.rstrip("/") + path, data=data, headers=headers,
                                     method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            line = json.loads(exc.read()).get("error") or exc.reason
        except Exception:
            line = exc.reason
        raise RunError(f"generation server {url} answered {path} with {exc.code}: {line}", key=key,
                       hint="its own log says more") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EngineNotAvailable(f"generation server {url} is unreachable ({reason})", key=key,
                                 hint=_START) from None


class RemoteGenerationBackend:
    """The generation contract over HTTP: :meth:`generate` to the proxy or spread over the
    servers, :meth:`update_weights` to every server, chunked; sleep and wake change nothing here."""

    accepts_images = False

    def __init__(self, config: Any) -> None:
        self.config = config
        settings = config.section(SECTION)
        self.urls = [str(u).rstrip("/") for u in settings.urls]
        self.proxy = str(settings.proxy_url).rstrip("/") if settings.proxy_url else None
        self.timeout = float(settings.timeout_s)
        self.chunk_bytes = int(settings.weight_chunk_mb) * 2**20
        self.expected: dict[str, int] = {}  # server id -> the version of the weights it was last given
        self.ids: dict[str, str] = {}  # url -> server id
        self.told_sleep = False

    @property
    def control(self) -> list[str]:
        """The servers that take weights: ``urls``, or the proxy alone when none is listed."""
        return self.urls or [self.proxy]  # type: ignore[list-item]

    def load_hf(self, model_path: str) -> None:
        """Check that every server is up and serves ``model_path``'s checkpoint (the same
        config.json and weight files), with its weights as loaded: a server an earlier run refitted
        reloads them (a resumed run refits them right after)."""
        check_addresses(self.urls, self.proxy)
        mine = model_fingerprint(model_path)
        for url in self.control:
            key = f"{SECTION}.urls" if self.urls else f"{SECTION}.proxy_url"
            info = call(url, "/info", timeout=self.timeout, key=key)
            if info.get("proxy"):
                            raise ConfigError(f"{url} is a proxy for generation servers ({', '.join(info.get('servers', []))}), "
                                  "and a proxy takes no weights", key=f"{SECTION}.urls",
                                  hint="list the servers behind it in policy.generation.remote.urls (SkyRL: "
                                       "external_server_urls)")
            if info.get("fingerprint") != mine:
                            raise ConfigError(f"generation server {url} serves {info.get('model')!r}, another checkpoint than the "
                                  f"policy's {model_path} (config.json or the weights differ)", key=key,
                                  hint="start the server on the policy's checkpoint (the same recipe)")
            version = int(info["version"])
            if not info.get("checkpoint", True):  # refitted by an earlier run: back to the checkpoint's weights
                version = int(call(url, "/reset", {}, timeout=self.timeout, key=key)["version"])
                log.info("remote generation: %s had taken an earlier run's weights; it reloaded the checkpoint", url)
            self.ids[url] = info["server_id"]
            self.expected[info["server_id"]] = version
        if self.proxy is not None and self.urls:
            call(self.proxy, "/info", timeout=self.timeout, key=f"{SECTION}.proxy_url")
        log.info("remote generation: %d server(s)%s", len(self.control),
                 f" behind the proxy {self.proxy}" if self.proxy and self.urls else "")

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int = 1) -> list[list[Sample]]:
        """``n`` samples per prompt: the whole call to the proxy, else one contiguous share of the
        prompts to each server (with ``request_seeds``, each prompt keeps its own seed)."""
        from concurrent.futures import ThreadPoolExecutor

        targets = [self.proxy] if self.proxy else self.urls
        size = -(-len(prompts) // len(targets)) if prompts else 1
        shares = [(url, first) for url, first in zip(targets, range(0, len(prompts), size), strict=False)]

        def one(url: str, first: int) -> list[list[Sample]]:
            part = sampling
            if sampling.request_seeds is not None:
                part = attrs.evolve(sampling, request_seeds=sampling.request_seeds[first:first + size])
            body = {"prompts": [list(map(int, p)) for p in prompts[first:first + size]], "n": n,
                    "sampling": attrs.asdict(part)}
            key = f"{SECTION}.proxy_url" if url == self.proxy else f"{SECTION}.urls"
            answer = call(url, "/generate", body, timeout=self.timeout, key=key)
            self._check_version(url, answer)
            share = prompts[first:first + size]
            return [[Sample(prompt_ids=tuple(share[i]), completion_ids=tuple(s["completion_ids"]),
                            logprobs=tuple(s["logprobs"]), finish_reason=s["finish_reason"]) for s in row]
                    for i, row in enumerate(answer["samples"])]

        if len(shares) == 1:
            return one(*shares[0])
        with ThreadPoolExecutor(len(shares)) as pool:
            parts = list(pool.map(lambda share: one(*share), shares))
        return [row for part in parts for row in part]

    def _check_version(self, url: str, answer: dict[str, Any]) -> None:
        server, version = answer.get("server_id"), answer.get("version")
        if server not in self.expected:
            raise RunError(f"{url} answered from a generation server corerl does not send weights to ({server})",
                           key=f"{SECTION}.urls", hint="list every server behind the proxy in policy.generation."
                                                      "remote.urls, or leave proxy_url unset")
        if version != self.expected[server]:
            raise RunError(f"{url} answered from weights of version {version}, not the last refit's "
                           f"({self.expected[server]})", key=f"{SECTION}.urls",
                           hint="one trainer refits a set of generation servers: give each run servers of its own")

    def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Send the weights to every server in safetensors chunks, then have each load them at once."""
        from concurrent.futures import ThreadPoolExecutor

        from safetensors.torch import save

        update, index, sent, started = uuid.uuid4().hex, 0, 0, time.monotonic()
        chunk: dict[str, Any] = {}
        size = 0
        pool = ThreadPoolExecutor(max(1, len(self.control)))

        def flush() -> None:
            nonlocal index, sent, chunk, size
            body = save(chunk)
            list(pool.map(lambda url: call(url, f"/weights/{update}/{index}", raw=body, timeout=self.timeout),
                          self.control))
            index, sent, chunk, size = index + 1, sent + len(body), {}, 0

        try:
            for name, tensor in weights:
                t = tensor.detach().to("cpu").contiguous().clone()
                if chunk and size + t.numel() * t.element_size() > self.chunk_bytes:
                    flush()
                chunk[name] = t
                size += t.numel() * t.element_size()
            if chunk:
                flush()
            answers = list(pool.map(lambda url: call(url, f"/weights/{update}/commit", {"chunks": index},
                                                     timeout=self.timeout), self.control))
        finally:
            pool.shutdown()
        for url, answer in zip(self.control, answers, strict=True):
            self.expected[self.ids.get(url, answer["server_id"])] = int(answer["version"])
        seconds = time.monotonic() - started
        log.info("remote generation: refit of %.1f MB in %d chunk(s) to %d server(s) in %.2f s", sent / 1e6, index,
                 len(self.control), seconds)

    def sleep(self) -> None:
        """Nothing: the servers' memory is not on this machine's devices."""
        if not self.told_sleep:
            log.info("remote generation: sleep/wake change nothing (the servers run apart from the run's devices)")
            self.told_sleep = True

    def wake(self) -> None:
        """Nothing (see :meth:`sleep`)."""

    def shutdown(self) -> None:
        """Nothing: the servers were started apart from the run and outlive it."""
