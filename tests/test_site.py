"""The series as a site (``make site``, ``tools/site/build.py``), built from the committed
notebooks and driven in a real browser, headless Chromium: every page loads without a console
error, every figure loads and has its alternative text, every internal link resolves, search finds
the lessons, previous/next follow the lesson order, and a phone-sized window still shows the text
and the figures.

The browser tests need Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them
where it can); without them they are skipped with a message saying so. The link tests read the
built HTML and run everywhere."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

REPO = Path(__file__).resolve().parents[1]
LESSONS = sorted(p.stem for p in REPO.glob("notebooks/[0-9]*.ipynb"))
#: Every page of the site, as its path without ``.html``.
PAGES = [
    "index",
    "project",
    "CONTRIBUTING",
    "search",
    *(f"docs/{p.stem}" for p in sorted(REPO.glob("docs/*.md"))),
    "data/gpu-traces/README",
    "data/h200-job/README",
    "data/nvrx-hang/README",
    *(f"notebooks/{stem}" for stem in LESSONS),
    *(f"solutions/{p.stem}" for p in sorted(REPO.glob("solutions/[0-9]*.ipynb"))),
]
NO_BROWSER = (
    "no headless Chromium here: install Debian's chromium and chromium-driver "
    "(apt-get install chromium chromium-driver) to run the site's browser tests"
)
#: A phone's window, in CSS pixels.
PHONE = (390, 844)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built by ``tools/site/build.py`` (warnings fail it) from the committed files."""
    out = tmp_path_factory.mktemp("site") / "site"
    subprocess.run(
        [sys.executable, str(REPO / "tools/site/build.py"), "--out", str(out)],
        check=True,
        cwd=REPO,
    )
    return out


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the tests' output stays the tests'
        pass


@pytest.fixture(scope="module")
def server(site):
    """The site served on loopback, as ``python -m http.server`` would: its base URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=site))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium driven by Selenium through Debian's chromedriver (skips without it)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.skip(NO_BROWSER)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def open_page(browser, url: str):
    """Load ``url`` and wait until its scripts ran; drop the console's earlier messages."""
    browser.get_log("browser")
    browser.get(url)
    browser.execute_script("return document.readyState")
    return browser


def console_errors(browser) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


# ------------------------------------------------------------------ the pages in a browser


@pytest.mark.parametrize("page", PAGES)
def test_the_page_loads_without_a_console_error(browser, server, page):
    open_page(browser, f"{server}{page}.html")
    assert browser.find_element("css selector", "main").text.strip(), f"{page}: no text"
    assert console_errors(browser) == []


@pytest.mark.parametrize("page", [p for p in PAGES if p.startswith(("notebooks", "solutions"))])
def test_every_figure_of_the_page_loads_and_has_alternative_text(browser, server, page):
    open_page(browser, f"{server}{page}.html")
    figures = browser.execute_script(
        "return [...document.querySelectorAll('main img')].map(i => "
        "({src: i.getAttribute('src'), alt: i.alt, loaded: i.complete && i.naturalWidth > 0}))"
    )
    assert [f["src"] for f in figures if not f["loaded"]] == []
    assert [f["src"] for f in figures if len(f["alt"].strip()) < 20] == []


def test_the_lessons_have_figures(site):
    pages = [site / f"notebooks/{stem}.html" for stem in LESSONS]
    with_figures = [p.stem for p in pages if "<img" in p.read_text()]
    assert len(with_figures) >= 10


@pytest.mark.parametrize(
    ("words", "lesson"),
    [("straggler", "04_reading_ddp_traces"), ("Flight Recorder", "08_when_a_job_hangs")],
    ids=["straggler", "Flight Recorder"],
)
def test_searching_finds_the_lesson_that_teaches_it(browser, server, words, lesson):
    from selenium.webdriver.support.ui import WebDriverWait

    open_page(browser, f"{server}search.html?q={words.replace(' ', '+')}")
    found = WebDriverWait(browser, 30).until(
        lambda b: b.execute_script(
            "const links = [...document.querySelectorAll('#search-results li a')];"
            "return links.length ? links.map(a => a.getAttribute('href')) : null"
        )
    )
    assert any(f"notebooks/{lesson}.html" in href for href in found), found
    assert console_errors(browser) == []


def test_next_leads_through_the_lessons_in_order_and_previous_back(browser, server):
    open_page(browser, f"{server}notebooks/{LESSONS[0]}.html")
    for lesson in LESSONS[1:]:
        browser.find_element("css selector", "a.right-next").click()
        assert urlparse(browser.current_url).path.endswith(f"notebooks/{lesson}.html")
    for lesson in reversed(LESSONS[:-1]):
        browser.find_element("css selector", "a.left-prev").click()
        assert urlparse(browser.current_url).path.endswith(f"notebooks/{lesson}.html")


def test_a_code_cell_has_a_copy_button(browser, server):
    open_page(browser, f"{server}notebooks/{LESSONS[3]}.html")
    buttons = browser.find_elements("css selector", "div.cell_input button.copybtn")
    assert buttons, "sphinx-copybutton puts a button on every code cell"


def test_a_phone_sized_window_shows_the_text_and_the_figures(browser, server):
    browser.set_window_size(*PHONE)
    try:
        open_page(browser, f"{server}notebooks/{LESSONS[3]}.html")
        width = browser.execute_script("return window.innerWidth")
        shown = browser.execute_script(
            "const box = e => e.getBoundingClientRect();"
            "const p = document.querySelector('main p'), img = document.querySelector('main img');"
            "return {page: document.documentElement.scrollWidth, text: box(p).width,"
            " textLeft: box(p).left, figure: box(img).width, figureLeft: box(img).left}"
        )
    finally:
        browser.set_window_size(1280, 1000)
    assert shown["page"] <= width, "nothing makes the whole page scroll sideways"
    assert 0 <= shown["textLeft"] and shown["text"] >= 0.8 * width - 40, "the text takes the width"
    assert 0 <= shown["figureLeft"] and 0.5 * width <= shown["figure"] <= width


def test_searching_works_from_the_disk_without_a_server(browser, site):
    from selenium.webdriver.support.ui import WebDriverWait

    open_page(browser, (site / "search.html").as_uri() + "?q=straggler")
    found = WebDriverWait(browser, 30).until(
        lambda b: b.execute_script(
            "const links = document.querySelectorAll('#search-results li a');"
            "return links.length || null"
        )
    )
    assert found


# ------------------------------------------------------------------ the built HTML


class _Anchors(HTMLParser):
    """The ids a page defines, the links it holds and what it loads (scripts, styles, images)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.loads: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(found["id"])
        if tag == "a" and found.get("href"):
            self.links.append(found["href"])
        if tag in ("script", "img") and found.get("src"):
            self.loads.append(found["src"])
        if tag == "link" and found.get("rel") == "stylesheet":
            self.loads.append(found.get("href", ""))


@functools.cache
def parsed(path: Path) -> _Anchors:
    anchors = _Anchors()
    anchors.feed(path.read_text())
    return anchors


def broken_links(site: Path, page: Path) -> list[str]:
    """The links of ``page`` that lead to no file of the site, or to no id of their page."""
    broken = []
    for link in parsed(page).links:
        url = urlparse(link)
        if url.scheme or link.startswith("//"):
            continue
        target = (page.parent / unquote(url.path)).resolve() if url.path else page
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            broken.append(f"{link}: no such file")
        elif url.fragment and target.suffix == ".html" and url.fragment not in parsed(target).ids:
            broken.append(f"{link}: no id {url.fragment!r} in {target.name}")
    return broken


def test_every_internal_link_of_every_page_resolves(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= len(PAGES)
    broken = {str(p.relative_to(site)): b for p in pages if (b := broken_links(site, p))}
    assert broken == {}


def test_a_lesson_links_each_word_to_its_entry_in_the_glossary(site):
    links = parsed(site / "notebooks/04_reading_ddp_traces.html").links
    assert "../docs/GLOSSARY.html#straggler" in links
    assert "straggler" in parsed(site / "docs/GLOSSARY.html").ids


def test_the_site_loads_nothing_from_another_host(site):
    remote = {
        f"{page.relative_to(site)}: {src}"
        for page in site.rglob("*.html")
        for src in parsed(page).loads
        if urlparse(src).scheme not in ("", "data") or src.startswith("//")
    }
    assert remote == set(), "the site works offline, in a room without a network"


def test_a_lesson_shows_its_committed_outputs(site):
    notebook = json.loads((REPO / f"notebooks/{LESSONS[0]}.ipynb").read_text())
    printed = [
        "".join(out["text"])
        for cell in notebook["cells"]
        for out in cell.get("outputs", [])
        if out.get("output_type") == "stream" and out.get("name") == "stdout"
    ]
    line = next(line for text in printed for line in text.splitlines() if len(line) > 30)
    page = (site / f"notebooks/{LESSONS[0]}.html").read_text()
    assert re.sub(r"\s+", " ", line.replace("&", "&amp;").replace("<", "&lt;")) in re.sub(
        r"\s+", " ", page
    )


def test_the_home_page_lists_every_lesson_in_order(site):
    home = parsed(site / "index.html").links
    lessons = [link for link in home if re.match(r"notebooks/\d\d_\w+\.html$", link)]
    assert list(dict.fromkeys(lessons)) == [f"notebooks/{stem}.html" for stem in LESSONS]


def test_the_solutions_are_a_section_apart_after_the_lessons(site):
    nav = (site / "index.html").read_text()
    captions = re.findall(
        r'<p aria-level="2" class="caption" role="heading">'
        r'<span class="caption-text">([^<]+)</span>',
        nav,
    )
    assert captions == ["Lessons", "Guides", "Solutions"]


@pytest.mark.parametrize("lesson", LESSONS)
def test_no_code_box_of_a_lesson_scrolls_sideways_at_1280_px(browser, server, lesson):
    # the lessons' code is cut at 88 characters; the code font must fit them in the column
    open_page(browser, f"{server}notebooks/{lesson}.html")
    scrolling = browser.execute_script(
        "return [...document.querySelectorAll('div.cell_input pre')]"
        ".filter(e => e.scrollWidth > e.clientWidth + 1)"
        ".map(e => e.innerText.split('\\n').reduce((a, l) => l.length > a.length ? l : a, ''))"
    )
    assert scrolling == [], f"code boxes that scroll sideways, their longest lines: {scrolling}"
