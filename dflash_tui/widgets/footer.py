"""Textual's Footer, without its leak: every time the key bar is rebuilt (a screen pushed or
popped, a binding enabled), each new key registers a watcher on the footer's `compact`, and
Textual drops the watchers of removed keys only when `compact` changes, which it never does
here (Textualize/textual#6666). Each viewer opened and closed left ~20 keys alive, with
their styles: in the keys-by-mode bench the app's memory grew ~200 KB an example and each
rebuild scanned a longer list. Here the rebuilt footer forgets the watchers of keys that are
no longer mounted."""

from __future__ import annotations

from textual.widgets import Footer as TextualFooter

# Where `textual.reactive._watch` keeps an observed object's watchers: {attribute:
# [(watching node, callback)]} (set with setattr, so the name is not mangled).
WATCHERS = "__watchers"


class Footer(TextualFooter):
    async def recompose(self) -> None:
        await super().recompose()
        for entries in getattr(self, WATCHERS, {}).values():
            entries[:] = [(node, cb) for node, cb in entries if node is self or node.is_attached]
