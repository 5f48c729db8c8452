"""``ccddp keygen``: Ed25519 identity keys and the allowlist peers are checked against.

Each rank (or each host, if its ranks share one identity) gets a private key file; the
allowlist holds only public keys and is copied to every host. Point the ranks at them
and every group's session (``ccddp.comm.session.establish``) uses the authenticated X25519
exchange instead of a shared secret::

    $ ccddp keygen --out keys --count 4
    $ export CCDDP_IDENTITY=keys/rank{rank}.pem CCDDP_ALLOWLIST=keys/allowlist.json
    $ ccddp selftest --world-size 4

``--names`` names the identities (e.g. hosts); ``--bind-ranks`` restricts identity i to
rank i; an existing allowlist is extended, never silently replaced.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ccddp.errors import ConfigError


SUMMARY = "create identity keys and the allowlist for authenticated key establishment"


def register(sub) -> None:
    p = sub.add_parser("keygen", help=SUMMARY, description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="ccddp-keys", help="directory for the key files (created, mode 0700)")
    p.add_argument("--count", type=int, default=None, help="identities to create (default: 1, or one per --names)")
    p.add_argument("--names", default=None, help="comma list of identity names (default: rank0, rank1, ...)")
    p.add_argument("--allowlist", default=None,
                   help="allowlist file to create or extend (default: OUT/allowlist.json)")
    p.add_argument("--bind-ranks", action="store_true", help="identity i may only be used by rank i (the job's global rank, in every group)")
    p.add_argument("--force", action="store_true", help="overwrite existing key files")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ccddp.crypto.establish import Allowlist, Identity, fingerprint

    names = [n.strip() for n in args.names.split(",")] if args.names else None
    count = args.count if args.count is not None else (len(names) if names else 1)
    if count < 1:
        raise ConfigError(f"--count must be >= 1, got {count}")
    if names is None:
        names = [f"rank{i}" for i in range(count)]
    if len(names) != count or len(set(names)) != count or not all(names):
        raise ConfigError(f"--names must list {count} distinct, non-empty names")
    for n in names:
        if "/" in n or n.startswith("."):
            raise ConfigError(f"identity name {n!r} cannot be a file name")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o700)
    allow_path = Path(args.allowlist) if args.allowlist else out / "allowlist.json"
    existing_keys: dict[str, bytes] = {}
    existing_ranks: dict = {}
    if allow_path.exists():
        import json

        doc = Allowlist.from_file(allow_path)  # validates
        for e in json.loads(doc.to_json())["identities"]:
            existing_keys[e["name"]] = bytes.fromhex(e["public_key"])
            existing_ranks[e["name"]] = e.get("ranks")
    for i, name in enumerate(names):
        key_file = out / f"{name}.pem"
        if key_file.exists() and not args.force:
            raise ConfigError(f"{key_file} exists; pass --force to replace it (peers will need the new allowlist)")
        if name in existing_keys and not args.force:
            raise ConfigError(f"{allow_path} already lists {name!r}; pass --force to replace it")
    rows = []
    for i, name in enumerate(names):
        ident = Identity.generate(name)
        key_file = out / f"{name}.pem"
        ident.save(key_file)
        existing_keys[name] = ident.public_bytes
        existing_ranks[name] = [i] if args.bind_ranks else None
        rows.append((name, fingerprint(ident.public_bytes), str(key_file)))
    allow_path.write_text(Allowlist(existing_keys, existing_ranks).to_json())
    for name, fp, path in rows:
        print(f"{name:<16} {fp}  {path}")
    print(f"allowlist: {allow_path} ({len(existing_keys)} identities)")
    example = out / (f"{names[0]}.pem" if count == 1 else "rank{rank}.pem")
    if names == [f"rank{i}" for i in range(count)] or count == 1:
        print(f"use: export CCDDP_IDENTITY={example} CCDDP_ALLOWLIST={allow_path}")
    return 0
