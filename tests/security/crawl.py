"""Finds every form and every query parameter a site offers by reading its pages: the
forms (fields with their default values), and the links and htmx requests (`href`,
`hx-get`, `hx-post`) with their query strings. What the pages offer is what a person can
send, so a test over this list covers forms added later without being told."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import parse_qsl, urljoin, urlsplit


@dataclass
class Target:
    """Somewhere to send input: a path, a method, and the fields with their defaults."""

    path: str
    method: str
    fields: dict[str, list[str]] = field(default_factory=dict)
    found_on: str = ""

    def key(self, route: Callable[[str], str]) -> tuple:
        # A GET page is one target with every parameter seen on it; a form is one per
        # set of fields.
        if self.method == "GET":
            return (route(self.path), self.method)
        return (route(self.path), self.method, tuple(sorted(self.fields)))


class _Page(HTMLParser):
    def __init__(self, url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.url = url
        self.links: list[tuple[str, str]] = []  # (method, url)
        self.forms: list[Target] = []
        self._form: Target | None = None
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for attr, method in (("href", "GET"), ("hx-get", "GET"), ("hx-post", "POST")):
            if a.get(attr) and tag != "form":
                self.links.append((method, urljoin(self.url, a[attr])))
        if tag == "form":
            method = "POST" if (a.get("method") or "get").lower() == "post" else "GET"
            action = a.get("action") or a.get("hx-post") or a.get("hx-get") or self.url
            if a.get("hx-post"):
                method = "POST"
            self._form = Target(urljoin(self.url, action), method, {}, self.url)
            self.forms.append(self._form)
        elif self._form is not None and tag in ("input", "select", "textarea", "button"):
            name = a.get("name")
            if not name:
                return
            kind = a.get("type", "text").lower()
            values = self._form.fields.setdefault(name, [])
            if tag == "select":
                self._select = name
            elif tag == "textarea":
                self._textarea = name
                values.append("")
            elif kind in ("checkbox", "radio", "submit") or tag == "button":
                if a.get("value") and a["value"] not in values:
                    values.append(a["value"])
            else:
                values.append(a.get("value", ""))
        elif tag == "option" and self._form is not None and self._select:
            self._form.fields.setdefault(self._select, []).append(a.get("value", ""))

    def handle_data(self, data: str) -> None:
        if self._form is not None and self._textarea:
            values = self._form.fields[self._textarea]
            values[-1] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None
        elif tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None


def crawl(
    fetch: Callable[[str], tuple[int, str, str]],
    start: Iterable[str],
    *,
    allowed: Callable[[str], bool],
    route: Callable[[str], str],
    limit: int = 400,
) -> list[Target]:
    """Read pages breadth first from `start` (each of those, then one page per route and
    query shape), and
    return one target per form and per linked URL shape. `fetch(path)` returns the status,
    the content type and the body."""
    seen_pages: set[tuple] = set()
    targets: dict[tuple, Target] = {}
    queue = list(start)
    every = set(start)  # read each of these, even when a page of its route was read
    pages = 0
    while queue and pages < limit:
        url = queue.pop(0)
        parts = urlsplit(url)
        path, query = parts.path, parse_qsl(parts.query, keep_blank_values=True)
        if not allowed(path):
            continue
        shape = (route(path), tuple(sorted({k for k, _ in query})))
        if shape in seen_pages and url not in every:
            continue
        seen_pages.add(shape)
        every.discard(url)
        get = targets.setdefault((route(path), "GET"), Target(path, "GET", {}, url))
        for name, value in query:
            get.fields.setdefault(name, [value])
        status, content_type, body = fetch(url)
        pages += 1
        if status != 200 or "html" not in content_type:
            continue
        page = _Page(url)
        page.feed(body)
        for method, link in page.links:
            link_parts = urlsplit(link)
            if link_parts.netloc and link_parts.netloc != "testserver":
                continue
            if method == "GET":
                queue.append(link_parts.path + (f"?{link_parts.query}" if link_parts.query else ""))
            else:
                post = Target(link_parts.path, "POST", {}, url)
                targets.setdefault(post.key(route), post)
        for form in page.forms:
            form.path = urlsplit(form.path).path
            if not allowed(form.path):
                continue
            if form.method == "GET":
                get = targets.setdefault(form.key(route), Target(form.path, "GET", {}, url))
                for name, values in form.fields.items():
                    get.fields.setdefault(name, values)
                queue.append(form.path)
            else:
                targets.setdefault(form.key(route), form)
    return list(targets.values())
