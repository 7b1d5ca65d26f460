#!/usr/bin/env python3
"""Checks that the docs point at files that exist.

Reads README.md, CHANGELOG.md, docs/*.md and every README.md under bench/,
and, in scripts, tests and bench sources, every `bench/results/...` path.
A path is checked when it is
- a `bench/results/...` or `docs/....md` path anywhere in the text (from the
  repository root),
- the target of a relative Markdown link `[text](target)` (from the file's
  folder; web links and anchors are skipped),
- in READMEs under bench/, a backquoted path starting with `./` or `../`
  (from the file's folder).

Usage: scripts/check_doc_links.py [REPO_ROOT]   (default: this script's repo)
Prints each missing path with the file and line that names it; exits 1 when
there is one, 0 otherwise.
"""
import os
import re
import sys

RESULTS = re.compile(r"bench/results/[A-Za-z0-9_.\-/]*")
DOCS = re.compile(r"(?<![A-Za-z0-9_/.])docs/[A-Za-z0-9_\-]+\.md")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
REL_TICK = re.compile(r"`(\.\.?/[^`\s]*)`")
SOURCE_EXTS = (".py", ".sh", ".cc", ".h", ".txt", ".cmake", ".md")


def doc_files(root):
    names = ["README.md", "CHANGELOG.md"]
    docs = os.path.join(root, "docs")
    names += sorted(os.path.join("docs", f) for f in os.listdir(docs)
                    if f.endswith(".md"))
    for folder, _, files in os.walk(os.path.join(root, "bench")):
        for f in files:
            if f == "README.md":
                names.append(os.path.relpath(os.path.join(folder, f), root))
    return [n for n in names if os.path.isfile(os.path.join(root, n))]


def source_files(root):
    for top in ("scripts", "tests", "bench", ".ci"):
        for folder, _, files in os.walk(os.path.join(root, top)):
            if os.path.join("bench", "results") in folder:
                continue
            for f in files:
                if f.endswith(SOURCE_EXTS) or top == ".ci":
                    yield os.path.relpath(os.path.join(folder, f), root)


def clean(path):
    path = path.split("#", 1)[0]
    return path.rstrip(".,;:)'\"")


def check(root):
    missing = []

    def need(path, base, where):
        path = clean(path)
        if not path or "*" in path or "$" in path or "<" in path:
            return
        if not os.path.exists(os.path.normpath(os.path.join(base, path))):
            missing.append(f"{where}: {path}")

    for name in doc_files(root):
        base = os.path.dirname(os.path.join(root, name))
        with open(os.path.join(root, name), encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                where = f"{name}:{n}"
                for m in RESULTS.finditer(line):
                    need(m.group(0), root, where)
                for m in DOCS.finditer(line):
                    need(m.group(0), root, where)
                for m in MD_LINK.finditer(line):
                    target = m.group(1)
                    if re.match(r"[a-z]+:", target) or target.startswith("#"):
                        continue
                    need(target, base, where)
                if name.startswith("bench"):  # results READMEs name siblings
                    for m in REL_TICK.finditer(line):
                        need(m.group(1), base, where)
    this = os.path.relpath(os.path.abspath(__file__), root)
    for name in source_files(root):
        if name == this:
            continue
        try:
            with open(os.path.join(root, name), encoding="utf-8") as f:
                lines = f.readlines()
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(lines, 1):
            for m in RESULTS.finditer(line):
                need(m.group(0), root, f"{name}:{n}")
    return missing


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    missing = check(root)
    for m in missing:
        print(f"missing: {m}")
    print(f"check_doc_links: {len(missing)} missing path(s)")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
