"""Screenshot of the playground page for the README (docs/playground.png), taken in headless Chromium.

    python scripts/playground_screenshot.py                      # starts `python -m app` (default model)
    python scripts/playground_screenshot.py --url http://127.0.0.1:8000   # a service already running

It asks one question, waits for the streamed answer and its verdict, opens the tooltip of the
least confident token and saves the whole page. Needs the test extra (selenium: `make install-dev`)
and Debian's `chromium` + `chromium-driver`. On 2 CPU cores the default model's first start takes
15-25 s (dequantising the GGUF) and the answer a few seconds more.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a file from a checkout: the repo's packages are importable

from benchmarks.server_process import running_server  # noqa: E402
from tests.app.api.playground.browser import (  # noqa: E402
    INSTALL_HINT,
    Chromium,
    Playground,
    find_chromium,
    headless_chromium,
)

DEFAULT_QUESTION = "Who wrote One Hundred Years of Solitude?"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running service (default: start one on a free loopback port)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "playground.png")
    parser.add_argument("--question", default=DEFAULT_QUESTION)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--model", help="TAD_MODEL for the started service (default: the service's default)")
    parser.add_argument("--artifact-dir", help="TAD_ARTIFACT_DIR for the started service (default: its default)")
    parser.add_argument("--api-key", default=os.environ.get("TAD_API_KEY"), help="typed into the page if it asks")
    parser.add_argument("--width", type=int, default=1280, help="browser window width in pixels")
    parser.add_argument(
        "--height",
        type=int,
        default=1900,
        help="keep the page's top this many pixels (the question, the answer and the calibration; 0: the whole page "
        "with every report curve)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the answer")
    return parser.parse_args(argv)


def take(url: str, args: argparse.Namespace, chromium: Chromium) -> Path:
    with headless_chromium(chromium, width=args.width) as driver:
        page = Playground(driver, url, timeout=args.timeout)
        page.open(api_key=args.api_key)
        page.ask(args.question, max_new_tokens=args.max_new_tokens)
        page.wait_for_verdict()
        token = page.least_confident()
        if token is not None:
            page.focus(token)
        return page.screenshot(args.out, focus=token, height=args.height or None)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chromium = find_chromium()
    if chromium is None:
        print(f"headless Chromium not found: {INSTALL_HINT}", file=sys.stderr)
        return 2
    if args.url:
        path = take(args.url, args, chromium)
    else:
        env = {
            name: value
            for name, value in (
                ("TAD_MODEL", args.model),
                ("TAD_ARTIFACT_DIR", args.artifact_dir),
                ("TAD_API_KEY", args.api_key),
            )
            if value
        }
        with running_server(env, ready_timeout=args.timeout) as url:
            path = take(url, args, chromium)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
