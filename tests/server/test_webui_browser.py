"""The chat page and the KV-cache page in headless Chromium (Selenium), against real servers:
replies stream from the embedded SmolLM2 and match what the openai client gets for the same
request; the KV page follows a long request's pages; model markup stays text; the API key
gates everything but the login prompt; a stopped or closed page frees its request."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from pagedattn.server.app import build_app
from tests.server.browser import chrome, require_chromium, wait_for
from tests.server.conftest import RunningServer, ServerFactory, serve_app

SMOL = "SmolLM2-135M-Instruct"
KEY = "sk-webui-test"


@pytest.fixture(autouse=True)
def _needs_chromium() -> None:
    require_chromium()


@contextmanager
def smol_server(**options: Any) -> Iterator[RunningServer]:
    app = build_app(None, kv_cache_mib=64, **options)
    with serve_app(app) as srv:
        yield srv


@pytest.fixture(scope="module")
def smol() -> Iterator[RunningServer]:
    with smol_server() as srv:
        yield srv


def by_css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def by_id(driver: Any, element_id: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def open_chat(driver: Any, url: str, model: str) -> None:
    driver.get(url + "/")
    wait_for(lambda: by_id(driver, "app").is_displayed(), 30, "the chat page")
    wait_for(lambda: by_id(driver, "model").get_attribute("value") == model, 30, "the model")


def set_field(driver: Any, element_id: str, value: str) -> None:
    """Type into a settings field as a user does (select all, type over)."""
    from selenium.webdriver.common.keys import Keys

    field = by_id(driver, element_id)
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.DELETE)
    if value:
        field.send_keys(value)


def send(driver: Any, text: str) -> None:
    from selenium.webdriver.common.keys import Keys

    by_id(driver, "prompt").send_keys(text, Keys.ENTER)


def replies_done(driver: Any, count: int, timeout_s: float = 120) -> list[Any]:
    def done() -> bool:
        counts = driver.execute_script(
            "return [document.querySelectorAll('.msg.assistant').length,"
            " document.querySelectorAll('.msg.assistant .typing').length]"
        )
        return bool(counts == [count, 0])

    wait_for(done, timeout_s, f"{count} finished replies")
    return by_css(driver, ".msg.assistant")  # no redraw after the last reply finished


def stored(driver: Any) -> list[dict[str, Any]]:
    raw = driver.execute_script("return localStorage.getItem('pagedattn.conversations')")
    conversations: list[dict[str, Any]] = json.loads(raw)
    return conversations


def severe_logs(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def stat(message: Any, cls: str) -> str:
    text: str = by_css(message, f".stats .{cls}")[0].text
    return text


WATCH_LENGTHS = """
window.__lengths = new Set();
new MutationObserver(() => {
  const replies = document.querySelectorAll('.msg.assistant');
  const last = replies[replies.length - 1];
  if (last && last.querySelector('.typing')) {
    window.__lengths.add(last.querySelector('.body').textContent.length);
  }
}).observe(document.getElementById('messages'),
           {subtree: true, childList: true, characterData: true});
"""


@pytest.mark.model
def test_chat_streams_replies_that_match_the_openai_client(smol: RunningServer) -> None:
    import openai
    from selenium.webdriver.common.keys import Keys

    client = openai.OpenAI(base_url=f"{smol.url}/v1", api_key="x", max_retries=0, timeout=120)
    with chrome() as driver:
        open_chat(driver, smol.url, SMOL)
        by_id(driver, "temperature").send_keys(Keys.HOME)  # the slider to 0: greedy
        assert by_id(driver, "temperature-value").text == "0"
        set_field(driver, "max_tokens", "40")
        driver.execute_script(WATCH_LENGTHS)
        question = "What is the capital of France? Answer in one sentence."
        send(driver, question)
        (reply,) = replies_done(driver, 1)
        lengths = driver.execute_script("return Array.from(window.__lengths)")
        conv = stored(driver)[0]
        content = conv["messages"][1]["content"]
        messages = [{"role": "user", "content": question}]
        expected = client.chat.completions.create(
            model=SMOL,
            messages=messages,
            temperature=0,
            top_p=1,
            max_tokens=40,  # type: ignore[arg-type]
        )
        assert content == expected.choices[0].message.content and "Paris" in content
        assert by_css(reply, ".body")[0].text.strip() == content.strip()
        usage = expected.usage
        assert usage is not None
        assert stat(reply, "stat-tokens") == f"{usage.completion_tokens} tokens"
        cached, prompt = stat(reply, "stat-cached").split()[0].split("/")
        assert int(prompt) == usage.prompt_tokens
        assert float(stat(reply, "stat-speed").split()[0]) > 0
        assert int(stat(reply, "stat-ttft").split()[1]) >= 0
        assert len([n for n in lengths if n > 0]) >= 2  # it showed the reply as it streamed

        # a second turn reuses the first turn's prompt pages (16 tokens each)
        follow = "And of Germany?"
        send(driver, follow)
        _, second = replies_done(driver, 2)
        cached, prompt = (int(n) for n in stat(second, "stat-cached").split()[0].split("/"))
        assert cached > 0 and cached % 16 == 0 and cached < prompt

        # edit the second question and resend: the conversation forks from there
        from selenium.webdriver.common.action_chains import ActionChains

        user_msg = by_css(driver, ".msg.user")[1]
        ActionChains(driver).move_to_element(user_msg).perform()  # the actions show on hover
        wait_for(lambda: [b for b in by_css(user_msg, ".actions button") if b.text == "Edit"])
        next(b for b in by_css(user_msg, ".actions button") if b.text == "Edit").click()
        editor = by_css(driver, ".msg.user textarea.editor")[0]
        editor.send_keys(Keys.CONTROL, "a")
        editor.send_keys("And of Italy?")
        next(b for b in by_css(driver, ".edit-actions button") if b.text == "Save & send").click()
        wait_for(lambda: len(stored(driver)[0]["messages"]) == 4 and not by_css(driver, ".typing"))
        msgs = stored(driver)[0]["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
        assert msgs[2]["content"] == "And of Italy?"
        history = [*messages, {"role": "assistant", "content": content}]
        edited = client.chat.completions.create(
            model=SMOL,
            messages=[*history, {"role": "user", "content": "And of Italy?"}],  # type: ignore[list-item]
            temperature=0,
            top_p=1,
            max_tokens=40,
        )
        assert msgs[3]["content"] == edited.choices[0].message.content

        # the conversation survives a reload (localStorage)
        driver.refresh()
        wait_for(lambda: len(by_css(driver, ".msg")) == 4, 30, "the stored conversation")
        assert severe_logs(driver) == []


def streamed_length(driver: Any) -> int:
    """Characters shown so far in the last reply (read in the page: it redraws as it streams)."""
    length: int = driver.execute_script(
        "const b = document.querySelectorAll('.msg.assistant .body');"
        "return b.length ? b[b.length - 1].textContent.length : 0"
    )
    return length


def _abort_count(srv: RunningServer) -> float:
    return srv.metrics().get('pagedattn:request_success_total{finished_reason="abort"}', 0.0)


@pytest.mark.model
def test_stop_and_a_closed_page_abort_the_request(smol: RunningServer) -> None:
    with chrome() as driver:
        open_chat(driver, smol.url, SMOL)
        set_field(driver, "max_tokens", "1000")  # the 91-page pool holds 1456 tokens
        set_field(driver, "extra", '{"ignore_eos": true}')
        before = _abort_count(smol)
        send(driver, "Tell me a very long story.")
        wait_for(lambda: streamed_length(driver) > 20, 60, "text")
        assert smol.metrics()["pagedattn:num_requests_running"] == 1
        by_id(driver, "stop").click()
        wait_for(lambda: by_css(driver, ".msg.assistant .note"), 30, "the stopped note")
        assert by_css(driver, ".msg.assistant .note")[0].text == "stopped"
        idle = smol.wait_idle()
        assert idle["pagedattn:num_requests_running"] == 0
        assert idle["pagedattn:num_used_pages"] == 0
        assert _abort_count(smol) == before + 1

        # closing the page mid-reply frees the request too
        send(driver, "Another long story, please.")
        wait_for(lambda: streamed_length(driver) > 20, 60, "text")
        driver.get("about:blank")
        idle = smol.wait_idle()
        assert idle["pagedattn:num_requests_running"] == 0
        assert idle["pagedattn:num_used_pages"] == 0
        assert _abort_count(smol) == before + 2


KV_VIEW = """
const row = document.querySelector('.req-row');
const count = (sel) => document.querySelectorAll(sel).length;
return {
  rows: count('.req-row'),
  id: row ? row.dataset.requestId : null,
  meta: row ? Array.from(row.querySelectorAll('.req-meta'), (e) => e.textContent) : [],
  strip: row ? row.querySelectorAll('.strip .pg').length : 0,
  legend: Object.fromEntries(Array.from(document.querySelectorAll('#legend b'),
    (b) => [b.className.replace('count-', ''), Number(b.textContent)])),
  cells: {f: count('#groups .cell.f'), c: count('#groups .cell.c'),
          u: count('#groups .cell.u'), s: count('#groups .cell.s'), all: count('#groups .cell')},
};
"""


def kv_view(driver: Any) -> dict[str, Any]:
    """What the KV page shows, read in one go (the page redraws every second)."""
    view: dict[str, Any] = driver.execute_script(KV_VIEW)
    return view


@pytest.mark.model
def test_kv_page_follows_a_long_request_and_frees_its_pages() -> None:
    import openai

    prompt = list(range(1000, 1050))  # 50 token ids
    generated = 200
    with smol_server() as srv, chrome() as driver:
        driver.get(srv.url + "/kv")
        wait_for(lambda: by_id(driver, "app").is_displayed(), 30, "the KV page")
        view = wait_for(lambda: (v := kv_view(driver))["legend"] and v, 30, "the legend")
        num_pages = view["legend"]["free"]
        assert view["legend"]["used"] == view["legend"]["shared"] == 0
        assert view["cells"]["all"] == view["cells"]["f"] == num_pages  # a cell per page
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=120)
        done = threading.Event()

        def run() -> None:
            try:
                client.completions.create(
                    model=SMOL, prompt=prompt, max_tokens=generated, extra_body={"ignore_eos": True}
                )
            finally:
                done.set()

        thread = threading.Thread(target=run)
        thread.start()
        try:
            view = wait_for(lambda: (v := kv_view(driver))["rows"] and v, 60, "the request's row")
            assert view["rows"] == 1 and view["id"].startswith("cmpl-")
            reserved = int(view["meta"][0].split()[0].split("/")[1])
            assert view["strip"] == math.ceil(reserved / 16)  # a 16-token page per entry
            assert view["legend"]["used"] + view["legend"]["shared"] == view["strip"]
            assert view["cells"]["u"] == view["legend"]["used"] > 0
            assert view["cells"]["s"] == view["legend"]["shared"]
        finally:
            thread.join(120)
        assert done.is_set()
        view = wait_for(
            lambda: (v := kv_view(driver))["rows"] == 0 and v["legend"]["used"] == 0 and v,
            30,
            "the pages to be freed",
        )
        # KV of 50 + 200 - 1 tokens was computed: its full pages stay cached in the LRU
        cached = (50 + generated - 1) // 16
        assert view["legend"]["cached"] == view["cells"]["c"] == cached
        assert view["legend"]["free"] == view["cells"]["f"] == num_pages - cached
        assert severe_logs(driver) == []


MARKUP = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script> **bold**'


def test_markup_from_the_model_or_storage_is_shown_as_text(
    make_server: ServerFactory,
) -> None:
    with make_server() as srv, chrome() as driver:
        open_chat(driver, srv.url, "tiny-llama")
        # the model is made to answer exactly the markup through the page's own settings
        set_field(driver, "max_tokens", "200")  # the tiny model's context is 512
        set_field(driver, "extra", json.dumps({"guided_choice": [MARKUP]}))
        send(driver, "hi")
        (reply,) = replies_done(driver, 1, 60)
        assert stored(driver)[0]["messages"][1]["content"] == MARKUP
        body = by_css(reply, ".body")[0]
        assert (
            body.text
            == '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script> bold'
        )
        assert by_css(body, "strong")[0].text == "bold"  # Markdown still renders
        assert by_css(driver, "#messages img, #messages script") == []
        assert driver.execute_script("return window.__pwned") is None

        # a stored conversation with markup and a javascript: link, loaded from storage
        conv = {
            "id": "c1",
            "title": "<b>title</b>",
            "updated": 1,
            "messages": [
                {"role": "user", "content": "<script>window.__pwned=3</script>"},
                {
                    "role": "assistant",
                    "content": "[click](javascript:window.__pwned=4) <img src=x onerror=alert(1)>"
                    "\n\n```html\n<script>window.__pwned=5</script>\n```",
                },
            ],
        }
        driver.execute_script(
            "localStorage.setItem('pagedattn.conversations', arguments[0])", json.dumps([conv])
        )
        driver.refresh()
        wait_for(lambda: len(by_css(driver, ".msg")) == 2, 30, "the stored conversation")
        assert by_css(driver, ".msg.user .body")[0].text == "<script>window.__pwned=3</script>"
        assistant = by_css(driver, ".msg.assistant .body")[0]
        assert "[click](javascript:window.__pwned=4)" in assistant.text
        assert (
            by_css(assistant, "a") == [] and by_css(driver, "#messages img, #messages script") == []
        )
        assert by_css(assistant, ".codeblock code")[0].text == "<script>window.__pwned=5</script>"
        assert by_css(driver, "#conversations .title")[0].text == "<b>title</b>"
        assert driver.execute_script("return window.__pwned") is None
        assert severe_logs(driver) == []


def test_with_an_api_key_a_page_shows_only_the_login_prompt(make_server: ServerFactory) -> None:
    import httpx

    with make_server(api_key=KEY) as srv:
        for path in ("/", "/kv", "/webui/chat.js", "/webui/style.css"):
            assert httpx.get(srv.url + path).status_code == 200, path
        assert httpx.get(srv.url + "/v1/kv/state").status_code == 401
        for page in ("/", "/kv"):
            with chrome() as driver:
                driver.get(srv.url + page)
                wait_for(lambda: by_id(driver, "login").is_displayed(), 30, "the login prompt")
                assert not by_id(driver, "app").is_displayed()
                assert "tiny-llama" not in driver.page_source
                by_id(driver, "login-key").send_keys("wrong-key")
                by_css(driver, "#login-form button")[0].click()
                wait_for(lambda: "Incorrect API key" in by_id(driver, "login-error").text)
                assert not by_id(driver, "app").is_displayed()
                by_id(driver, "login-key").send_keys(KEY)
                by_css(driver, "#login-form button")[0].click()
                wait_for(lambda: by_id(driver, "app").is_displayed(), 30, "the page")
                assert not by_id(driver, "login").is_displayed()
                key = driver.execute_script("return sessionStorage.getItem('pagedattn.apiKey')")
                assert key == KEY
                assert KEY not in json.dumps(driver.execute_script("return {...localStorage}"))
                if page == "/":
                    assert by_id(driver, "model").get_attribute("value") == "tiny-llama"
                else:
                    wait_for(lambda: "tiny-llama" in by_id(driver, "status").text, 30, "state")
                # the other page of the same tab needs no second login
                driver.get(srv.url + ("/kv" if page == "/" else "/"))
                wait_for(lambda: by_id(driver, "app").is_displayed(), 30, "the other page")
                assert all("401" in m for m in severe_logs(driver))  # only the refused calls
