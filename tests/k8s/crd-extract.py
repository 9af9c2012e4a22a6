#!/usr/bin/python3
"""Turns an operator's CustomResourceDefinition (YAML, as published in its
repository) into the schema file that tests/k8s/validate.js reads: the
openAPIV3Schema of every served version, without the descriptions (most of a
CRD's bytes, and no use to a validator). The files under tests/k8s/crds/ were
made with it; their sources are listed in tests/k8s/crds/README.md.

    crd-extract.py CRD.yaml SOURCE > tests/k8s/crds/NAME.json
"""
import json
import sys

import yaml


def strip(node):
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: crd-extract.py CRD.yaml SOURCE")
    with open(sys.argv[1]) as f:
        crd = next(d for d in yaml.safe_load_all(f) if d and d.get("kind") == "CustomResourceDefinition")
    spec = crd["spec"]
    out = {
        "source": sys.argv[2],
        "group": spec["group"],
        "kind": spec["names"]["kind"],
        "versions": {
            v["name"]: strip(v["schema"]["openAPIV3Schema"]) for v in spec["versions"] if v.get("served", True)
        },
    }
    json.dump(out, sys.stdout, separators=(",", ":"), sort_keys=True)
    sys.stdout.write("\n")


main()
