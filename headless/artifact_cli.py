"""``steadfast artifact export``, ``import``, ``inspect``: one machine's compile cache as one file a fleet can
share (:mod:`core.compile.warm.artifact`).

``steadfast artifact export --name NAME [--cache-root DIR] [--device cpu|cuda] [--inductor-preset P] [--key KEY]
[--no-gzip] -o FILE``: the cache folder ``<root>/<NAME>/<key>`` whose key fields are this machine's (for the device and
preset) as one checked tar; ``steadfast artifact import FILE [--cache-root DIR] [--sha256 HEX]``: check it and move
its files into the cache; ``steadfast artifact inspect FILE``: its manifest. The cache root is ``--cache-root``,
else ``$STEADFAST_COMPILE_CACHE``, else ``<ComfyUI>/user/steadfast/compile_cache`` (``$COMFYUI_PATH`` or
``~/comfy/ComfyUI``). The warm state is made by running the workflow once (in ComfyUI, or ``steadfast run`` with
``$STEADFAST_COMPILE_CACHE`` set). Exit codes: 0 done; 2 refused or unusable (the message says why).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The ``steadfast artifact`` parser (subcommands ``export``, ``import``, ``inspect``)."""
    from ..core.compile.presets import PRESET_NAMES

    p = argparse.ArgumentParser(
        prog="steadfast artifact",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="write a compile cache as one artifact file")
    e.add_argument("--name", default="default", help="the compile cache name (Optimize Model's compile_cache)")
    e.add_argument("--cache-root", type=Path, metavar="DIR", help="the operator's compile-cache root")
    e.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="what the kernels were built for (default: cuda when available, else cpu)",
    )
    e.add_argument("--inductor-preset", default="none", choices=PRESET_NAMES, help="Optimize Model's inductor_preset")
    e.add_argument("--key", help="export this key folder (as listed when none matches this machine)")
    e.add_argument(
        "--no-gzip",
        action="store_true",
        help="a plain tar (default: gzipped, about 5x smaller on CPU caches, as fast to import)",
    )
    e.add_argument("-o", "--output", type=Path, required=True, metavar="FILE")
    i = sub.add_parser("import", help="check an artifact and move it into the compile cache")
    i.add_argument("file", type=Path)
    i.add_argument("--cache-root", type=Path, metavar="DIR", help="the operator's compile-cache root")
    i.add_argument("--sha256", metavar="HEX", help="the pinned SHA-256 of the whole file (refused if it differs)")
    i.add_argument("--device", choices=("cpu", "cuda"), help="default: the kind the artifact was made for")
    s = sub.add_parser("inspect", help="print an artifact's manifest")
    s.add_argument("file", type=Path)
    s.add_argument("--json", action="store_true", help="the whole manifest as JSON (every member)")
    return p


class _Unusable(Exception):
    pass


def _root(given: Path | None) -> Path:
    from ..core.compile.warm import cache_location

    if given is not None:
        return given.expanduser()
    from .comfy_server import find_comfyui

    comfy = find_comfyui()
    root, why = cache_location.resolve_root(comfy / "user" if comfy is not None else None)
    if root is None:
        raise _Unusable(f"no compile-cache root ({why}); pass --cache-root")
    return root


def _forbidden() -> tuple[str, ...]:
    """The folders HTTP clients can write in the ComfyUI this CLI finds (``$COMFYUI_PATH`` or ``~/comfy/ComfyUI``,
    its default layout: :func:`core.compile.warm.cache_location.client_writable`); empty without one. A compile-cache
    root overlapping one is refused (:func:`core.compile.warm.cache_location.check_location`)."""
    from ..core.compile.warm import cache_location
    from .comfy_server import find_comfyui

    comfy = find_comfyui()
    if comfy is None:
        return ()
    return cache_location.client_writable(comfy / "input", comfy / "output", comfy / "temp", comfy / "user")


def _describe(fields: dict[str, Any]) -> str:
    extra = f", inductor {fields['inductor_options']}" if fields.get("inductor_options") else ""
    return (
        f"torch {fields.get('torch')}, {fields.get('python')}, {fields.get('device')}, pack {fields.get('pack')}"
        + extra
    )


def _same_but_trace(named: Path, fields: dict, manifest: str) -> str | None:
    """The one key folder under ``named`` whose manifest has ``fields`` but for ``"trace"`` (the switches a trace
    reads,
    :func:`core.torch_compat.trace_state`: a ComfyUI server sets some at start, this command does not), or None when
    there is none or more than one (the command then lists them)."""
    want = {k: v for k, v in json.loads(json.dumps(fields, default=str)).items() if k != "trace"}
    hits = []
    for d in sorted(named.iterdir()):
        if not d.is_dir() or d.name.startswith(".") or ".bad-" in d.name:
            continue
        try:
            body = json.loads((d / manifest).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        got = body.get("fields") if isinstance(body, dict) else None
        if isinstance(got, dict) and {k: v for k, v in got.items() if k != "trace"} == want:
            hits.append(d.name)
    return hits[0] if len(hits) == 1 else None


def _export(args: argparse.Namespace) -> int:
    import torch

    from ..core.compile import presets
    from ..core.compile.warm import artifact, cache, cache_location

    if cache_location.check_name(args.name) != args.name:
        raise _Unusable(f"--name {args.name!r} is not a cache name")
    named = _root(args.cache_root) / args.name
    if not named.is_dir():
        raise _Unusable(f"no compile cache named {args.name!r} under the root (run the workflow once first)")
    if args.key is None:
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        fields = cache.cache_key_fields(device, presets.preset_options(args.inductor_preset, "inductor"))
        key = cache.cache_key(fields)
        if not (named / key).is_dir():  # the server's trace state (SDPA switches ComfyUI sets) is not this process's
            key = _same_but_trace(named, fields, cache.MANIFEST) or key
        if not (named / key).is_dir():
            found = []
            for d in sorted(named.iterdir()):
                if d.is_dir() and not d.name.startswith(".") and ".bad-" not in d.name:
                    try:
                        body = json.loads((d / cache.MANIFEST).read_text(encoding="utf-8"))
                        found.append(f"  --key {d.name}: {_describe(body['fields'])}")
                    except (OSError, ValueError, KeyError, TypeError):
                        found.append(f"  --key {d.name}: (no readable manifest)")
            raise _Unusable(
                f"compile cache {args.name!r} has no folder for this machine ({_describe(fields)}); "
                + ("it has:\n" + "\n".join(found) if found else "it is empty")
            )
    else:
        key = args.key
        if cache_location.check_name(key) != key or not (named / key).is_dir():
            raise _Unusable(f"compile cache {args.name!r} has no key folder {key!r}")
    info = artifact.export_artifact(named / key, args.output, compress=not args.no_gzip)
    print(
        f"wrote {args.output}: compile cache {info.name!r}, {info.files} files, {info.bytes} bytes "
        f"({info.unrecorded} unrecorded and {info.changed} changed file(s) left out)\n"
        f"made for: {_describe(info.fields)}\nsha256 {info.sha256}"
    )
    return 0


def _import(args: argparse.Namespace) -> int:
    from ..core.compile.warm import artifact

    t0 = time.perf_counter()
    info = artifact.import_artifact(
        args.file, _root(args.cache_root), expected_sha256=args.sha256, device=args.device, forbidden=_forbidden()
    )
    print(
        f"imported {args.file.name} into compile cache {info.name!r}: {info.files} files ({info.written} new), "
        f"{info.bytes} bytes in {time.perf_counter() - t0:.2f} s"
        + (
            ""
            if args.sha256
            else "\nnot pinned: pass --sha256 (or $STEADFAST_COMPILE_ARTIFACT_SHA256) to refuse a tampered file"
        )
    )
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from ..core.compile.warm import artifact

    body = artifact.inspect_artifact(args.file)
    if args.json:
        print(json.dumps(body, indent=1, sort_keys=True))
        return 0
    members = body.get("members", {})
    made = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(body.get("created") or 0))
    print(
        f"{args.file.name}: Steadfast compile artifact (format {body.get('steadfast_artifact')})\n"
        f"  cache name {body.get('name')!r}, key {body.get('key')}\n  made for {_describe(body['fields'])}\n"
        f"  made by Steadfast {body.get('pack')} at {made} UTC\n"
        f"  {len(members)} files, {sum(v[0] for v in members.values())} bytes; file {body['bytes']} bytes\n"
        f"  sha256 {body['sha256']}"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``steadfast artifact ...``.

    Args:
        argv: the arguments after ``artifact`` (default ``sys.argv[2:]``).
    Returns:
        0 done; 2 refused or unusable (the reason printed on stderr).
    """
    args = build_parser().parse_args(list(sys.argv[2:] if argv is None else argv))
    from ..core.compile.warm import artifact, cache_location

    try:
        return {"export": _export, "import": _import, "inspect": _inspect}[args.command](args)
    except (_Unusable, artifact.ArtifactRefused, cache_location.CacheRefused, ValueError) as e:
        print(f"steadfast artifact {args.command}: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"steadfast artifact {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
