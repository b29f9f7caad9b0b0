"""Pythonic tool calls (Llama 3.2 / 4): the reply is a Python list of calls,
``[get_weather(city="Paris"), get_time()]``, arguments literals only."""

from __future__ import annotations

import ast
import json

from .base import ToolParser
from .json_scan import PartialCall, skip_ws


class PythonicToolParser(ToolParser):
    """``--tool-call-parser pythonic``: calls are read once the list closes
    (their arguments are Python, turned into a JSON object); each call's
    arguments stream as one piece."""

    name = "pythonic"
    markers = ("[",)

    def section_start(self, text: str) -> int | None:
        i = skip_ws(text, 0)
        return i if text.startswith("[", i) else None

    def read_section(self, section: str, final: bool) -> list[PartialCall] | None:
        stripped = section.strip()
        try:
            tree = ast.parse(stripped, mode="eval")
        except SyntaxError:
            return None if final else []
        if not isinstance(tree.body, ast.List):
            return None
        calls = []
        for node in tree.body.elts:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                return None
            try:
                args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
            except ValueError:
                return None
            if None in args:
                return None
            calls.append(PartialCall(node.func.id, json.dumps(args), True, len(section)))
        return calls
