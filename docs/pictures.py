"""The pictures of README and the docs, made from a real run of the built-in demo (needs torch,
``pip install '.[demo]'``, and Debian's ``chromium`` for the screenshot):

- ``docs/demo.txt``: what ``stalldoc demo`` prints on the terminal, whole (the demo's job prints
  nothing), but the line that says this machine has no NVIDIA driver; paths shown relative to
  the checkout;
- ``docs/report.png``: the top of ``stalldoc report --format html`` of that run, in headless
  Chromium with the network off;
- README's block between ``<!-- demo:start -->`` and ``<!-- demo:end -->``: ``docs/demo.txt``
  (``tests/test_readme.py`` holds them equal).

Run ``python docs/pictures.py`` after a change to what the demo or the HTML report show.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def demo_text(run_dir: Path) -> str:
    """Run the demo; what it printed (stderr, then its closing lines on stdout), the checkout's
    path made relative."""
    out = subprocess.run([sys.executable, "-m", "stalldoc", "demo", "--run-dir", str(run_dir)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, check=True)
    lines = [line.replace(str(ROOT) + "/", "").replace(str(run_dir), "RUN_DIR")
             for line in (out.stderr + out.stdout).splitlines() if "nvml probe off" not in line]
    return "\n".join(lines) + "\n"


def screenshot(run_dir: Path, png: Path, work: Path) -> None:
    page = work / "report.html"
    subprocess.run([sys.executable, "-m", "stalldoc", "report", str(run_dir), "--format", "html",
                    "-o", str(page)], check=True, timeout=120, cwd=ROOT)
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("docs/pictures.py: needs chromium (Debian package chromium)")
    subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                    f"--user-data-dir={work / 'profile'}", "--proxy-server=127.0.0.1:9",
                    f"--screenshot={png}", "--window-size=1280,1100", page.as_uri()],
                   check=True, timeout=120, capture_output=True)


START, END = "<!-- demo:start -->\n", "<!-- demo:end -->"


def readme_block(text: str) -> str:
    """README's demo block: the terminal text in a fenced block."""
    return f"{START}```text\n{text}```\n{END}"


def put_in_readme(text: str) -> None:
    readme = ROOT / "README.md"
    old = readme.read_text()
    head, rest = old.split(START, 1)
    readme.write_text(head + readme_block(text) + rest.split(END, 1)[1])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run_dir = work / "run"
        text = demo_text(run_dir)
        (DOCS / "demo.txt").write_text(text)
        put_in_readme(text)
        screenshot(run_dir, DOCS / "report.png", work)
    print("wrote docs/demo.txt, docs/report.png and README's demo block")


if __name__ == "__main__":
    main()
