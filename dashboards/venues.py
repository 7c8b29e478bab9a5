"""Paper sizes: the column and text widths and the body font size of the venues tables and figures are made for.

`privbench leaderboard --format latex --width single|double` and `privbench plot --size single|double` take
their widths from one venue (`--venue`, default `article`), so a table and a figure made for the same paper
agree. The numbers are each class's own (`\\showthe\\columnwidth`, `\\showthe\\textwidth` in a document of
that class): TeX points, 72.27 to the inch.
"""

from __future__ import annotations

import dataclasses

POINTS_PER_INCH = 72.27  # TeX's point
WIDTHS = ("single", "double")


@dataclasses.dataclass(frozen=True)
class Venue:
    name: str
    description: str
    column_pt: float  # \columnwidth: one column of the two
    text_pt: float  # \textwidth: both columns (a table* or figure*)
    font_pt: int  # the body text size
    fonts: str = "cm"  # the text fonts the class sets (dashboards/latex.py FONTS): Computer Modern, or Times

    def width_pt(self, width: str) -> float:
        if width not in WIDTHS:
            raise ValueError(f"unknown width {width!r}; known: {', '.join(WIDTHS)}")
        return self.column_pt if width == "single" else self.text_pt

    def width_in(self, width: str) -> float:
        return self.width_pt(width) / POINTS_PER_INCH


VENUES = {v.name: v for v in (
    Venue("article", "LaTeX's two-column article (\\documentclass[twocolumn]{article}, 10 pt, US letter)",
          229.5, 469.0, 10),
    Venue("acm", "ACM's acmart, sigconf (9 pt)", 241.14749, 506.295, 9),
    Venue("ieee", "IEEEtran, conference (10 pt, US letter)", 252.0, 516.0, 10, fonts="times"),
)}
DEFAULT_VENUE = "article"


def venue(name: str) -> Venue:
    """The venue of that name; ValueError naming the known ones."""
    if name not in VENUES:
        raise ValueError(f"unknown venue {name!r}; known: {', '.join(VENUES)}")
    return VENUES[name]
