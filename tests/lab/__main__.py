"""python -m tests.lab up|down|status|destroy — the lab for people.

``up`` brings the sshd and the container up (building it the first time),
holds a "manual" lease until ``down``, and prints the hosts.yaml that reaches
it (also written to <state>/hosts.yaml). ``up --pair`` brings up containers 202
and 203 on the pair network instead (tests/lab/pair.py) and prints/writes
<state>/hosts-pair.yaml (hosts lab-a, lab-b and the group ``pair``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from . import Lab, LabUnavailable
from .lab import DEFAULT_VMID
from .pair import Pair


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.lab", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["up", "down", "status", "destroy"])
    ap.add_argument("--state-dir", default=None, help="default: $DFO_LAB_DIR or /var/lib/dfo-lab")
    ap.add_argument("--vmid", type=int, default=DEFAULT_VMID)
    ap.add_argument("--no-container", action="store_true", help="up: only the sshd node")
    ap.add_argument("--pair", action="store_true",
                    help="up: containers 202+203 on the pair network (not 200)")
    ap.add_argument("--root", default="/root/dfo", help="up: remote root for the lab host")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    lab = Lab(args.state_dir, vmid=args.vmid)
    try:
        if args.command == "up" and args.pair:
            pinfo = Pair(lab).up(lease="manual")
            hosts = pinfo.hosts_yaml(root=args.root)
            (lab.state_dir / "hosts-pair.yaml").write_text(hosts)
            if args.json:
                print(json.dumps({**asdict(pinfo), "hosts_yaml": hosts}, indent=2))
            else:
                members = ", ".join(f"{n} = CT {v} {a}" for n, v, a in
                                    zip(pinfo.host_names, pinfo.vmids, pinfo.addresses, strict=True))
                print(f"# pair up: {members} on {pinfo.ifname}   timings: {pinfo.timings}")
                print(f"# written to {lab.state_dir / 'hosts-pair.yaml'}")
                print(hosts, end="")
        elif args.command == "up":
            info = lab.up(container=not args.no_container, lease="manual")
            hosts = info.hosts_yaml(root=args.root)
            (lab.state_dir / "hosts.yaml").write_text(hosts)
            if args.json:
                print(json.dumps({**asdict(info), "hosts_yaml": hosts}, indent=2))
            else:
                print(f"# lab up: ssh -F {info.ssh_config} dfo-lab-node   timings: {info.timings}")
                print(f"# written to {lab.state_dir / 'hosts.yaml'}")
                print(hosts, end="")
        elif args.command == "down":
            lab.down()
            print(json.dumps(lab.status()) if args.json else "lab down (containers kept built)")
        elif args.command == "destroy":
            lab.destroy()
            print(json.dumps(lab.status()) if args.json else "lab destroyed (template cache kept)")
        else:
            st = lab.status()
            if args.json:
                print(json.dumps(st, indent=2))
            else:
                s = st["sshd"]
                print(f"state dir : {st['state_dir']}")
                print(f"sshd      : {'running pid %s port %s' % (s['pid'], s['port']) if s['running'] else 'stopped'}")
                for name, state in st["containers"].items() or {"(none built)": ""}.items():
                    print(f"container : {name} {state}")
                net = st["pair_network"]
                ports = " ".join(net.get("ports", []))
                where = f"netns {net['netns']}, br0 ports {ports}" if net["up"] else "down"
                print(f"pair net  : {where}")
                print(f"leases    : {', '.join(st['leases']) or '-'}")
    except LabUnavailable as e:
        print(f"lab: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
