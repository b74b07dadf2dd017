"""The pages' files over HTTP: strict security headers, no inline script or style anywhere,
nothing loaded from another origin, every referenced asset served, and `--no-webui`."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import httpx

from pagedattn.server.app import build_app
from pagedattn.server.webui import ASSETS, STATIC
from tests.server.conftest import ServerFactory, serve_app, serve_subprocess


class _Refs(HTMLParser):
    """Collects the src / href of a page and whatever could run or style inline."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.inline: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        for name, _value in attrs:
            if name.startswith("on") or name == "style":
                self.inline.append(f"{tag} {name}")
        if tag == "style":
            self.inline.append("style element")
        if tag == "script" and not names.get("src"):
            self.inline.append("inline script")
        self.refs += [v for k, v in attrs if k in ("src", "href") and v]


def test_pages_and_assets_carry_a_strict_policy(make_server: ServerFactory) -> None:
    with make_server() as srv:
        for page in ("/", "/kv"):
            r = httpx.get(srv.url + page)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
            csp = r.headers["content-security-policy"]
            for directive in ("default-src 'self'", "script-src 'self'", "style-src 'self'"):
                assert directive in csp
            assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["x-frame-options"] == "DENY"
            parser = _Refs()
            parser.feed(r.text)
            assert parser.inline == [], page
            for ref in parser.refs:
                assert ref.startswith("/"), ref  # this origin only
                if ref.startswith("/webui/"):
                    asset = httpx.get(srv.url + ref)
                    assert asset.status_code == 200, ref
                    assert asset.headers["content-security-policy"] == csp
        assert httpx.get(srv.url + "/webui/../app.py").status_code == 404
        assert httpx.get(srv.url + "/webui/nope.js").status_code == 404


def test_scripts_never_write_html_or_fetch_elsewhere() -> None:
    for name in ASSETS:
        if not name.endswith(".js"):
            continue
        lines = (STATIC / name).read_text().splitlines()
        text = "\n".join(line for line in lines if not line.lstrip().startswith("//"))
        for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert banned not in text, (name, banned)
        assert "new Function" not in text and 'setAttribute("style"' not in text
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text), name


def test_every_static_file_is_served() -> None:
    shipped = {p.name for p in Path(STATIC).iterdir()}
    assert shipped == {"index.html", "kv.html", *ASSETS}


def test_without_the_webui_the_pages_are_gone(tiny_model_dir: Path) -> None:
    app = build_app(str(tiny_model_dir), webui=False, page_size=4, num_pages=32)
    with serve_app(app) as srv:
        for path in ("/", "/kv", "/webui/chat.js"):
            assert httpx.get(srv.url + path).status_code == 404, path
        assert httpx.get(srv.url + "/v1/kv/state").status_code == 200  # the JSON stays
    args = ["--model", str(tiny_model_dir), "--num-pages", "32", "--log-level", "warning"]
    with serve_subprocess([*args, "--no-webui"]) as url:
        assert httpx.get(url + "/").status_code == 404
        assert httpx.get(url + "/kv").status_code == 404
    with serve_subprocess(args) as url:
        assert httpx.get(url + "/").status_code == 200
