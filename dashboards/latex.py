"""The leaderboard as LaTeX that fits a paper by design: never shrunk with `\\resizebox`.

A table is made for one width (a venue's column or text width, dashboards/venues.py) and measured before it
is written, with the widths pdflatex gives the glyphs of the venue's text fonts (Computer Modern, or Times and
Courier in IEEEtran: dashboards/tex_metrics.py). The writer then picks the most readable layout that fits:
the venue's body size, else 9 pt, else 8 pt (never smaller), full headers, else abbreviated ones explained in
a legend line, normal column spacing, else tighter. When the chosen columns fit no single table, they are
split into stacked tables that each repeat the key columns (mechanism and target epsilon).

Every number is written as every other output writes its quantity (`storage/schema.py`: one number of
decimals per quantity, so that, right-aligned, a column aligns on the decimal point), rounded up for upper
bounds and down for lower bounds. Units go in the headers. The output needs one package, `booktabs`, named
in its first line; superscripts and subscripts (below 8 pt) are never used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from dashboards.leaderboard import LeaderboardRow, honest
from dashboards.tex_metrics import MATH, SPACE, TEXT
from dashboards.venues import WIDTHS, Venue
from storage import schema

PACKAGES = ("booktabs",)
FLOATS = ("none", "table", "table*")
KEY_COLUMNS = ("mechanism", "eps target")  # repeated by every part of a split table
LEAVE_OUT = ("dataset", "model", "pareto")  # dataset / model head each block of rows; bold marks the best
SIZES = (10, 9, 8)  # points; 8 is the smallest text a venue accepts in a table
SEPARATIONS = (6.0, 4.0, 3.0)  # \tabcolsep: LaTeX's default, then tighter
LINE_SPACING = 1.2
STATUS_ABBR = {"overclaimed": "over.", "uncertified": "uncert.", "violated": "viol."}
SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
            "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
            "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}"}  # OT1 would set ¡ ¿ —
GREEK = {"eps": "varepsilon", "sigma": "sigma", "mu": "mu"}  # words of schema labels set as Greek letters
UNITS = {"x": r"$\times$", "%": r"\%"}
MEDIUM_SPACE = 8 / 18  # \medmuskip on both sides of a binary operator (4 mu each), in em
MARGIN = 1.0  # points kept free: kerning is not measured (measured widths are within 0.3 pt of pdflatex's)
# A Tex run names its font by Computer Modern's name for its role (roman, bold, italic, typewriter); a venue
# whose class sets text in other fonts (`Venue.fonts`) measures each role in its own font (math stays cmmi/cmsy).
FONTS = {"cm": {"cmr": "cmr", "cmbx": "cmbx", "cmti": "cmti", "cmtt": "cmtt"},
         "times": {"cmr": "ptmr7t", "cmbx": "ptmb7t", "cmti": "ptmri7t", "cmtt": "pcrr7t"}}
# Interword spaces a class sets instead of the font's own, in em: IEEEtran widens its roman and italic to 0.35,
# its bold to 0.375, at every size (its \@IEEEtunefonts; Courier keeps its own).
SPACE_EM = {"times": {"cmr": 0.35, "cmti": 0.35, "cmbx": 0.375}}


def escape(text: str) -> str:
    """Text-mode escaping of LaTeX's ten special characters (names like `dp_forward`, `50%`)."""
    return "".join(SPECIALS.get(ch, ch) for ch in str(text))


# Measured LaTeX ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Tex:
    """A piece of LaTeX and what sets it: runs of (font, text) for cmr / cmbx / cmti / cmtt, (cmmi or cmsy,
    glyph name) for math, ("em", fraction) for math spacing, so its width is known at any size and in any of
    `FONTS`."""

    latex: str
    runs: tuple[tuple[str, str | float], ...] = ()

    def __add__(self, other: Tex) -> Tex:
        return Tex(self.latex + other.latex, self.runs + other.runs)

    def width(self, size: int, fonts: str = "cm") -> float:
        total = 0.0
        for font, payload in self.runs:
            if font == "em":
                total += float(payload) * size
            elif font in ("cmmi", "cmsy"):
                total += MATH[(font, size)][str(payload)]
            else:
                face = (FONTS[fonts][font], size)
                widths, space = TEXT[face], SPACE_EM.get(fonts, {}).get(font, 0.0) * size or SPACE[face]
                total += sum(space if ch == " " else widths[ord(ch) - 32] if 32 < ord(ch) < 127
                             else 0.5 * size for ch in str(payload))
        return total


EMPTY = Tex("")
FONT_COMMANDS = {"cmr": "{}", "cmbx": r"\textbf{{{}}}", "cmti": r"\textit{{{}}}", "cmtt": r"\texttt{{{}}}"}


def text(s: str, font: str = "cmr") -> Tex:
    return Tex(FONT_COMMANDS[font].format(escape(s)), ((font, s),)) if s else EMPTY


def greek(name: str) -> Tex:
    return Tex(rf"$\{name}$", (("cmmi", name),))


def binary(name: str) -> Tex:
    """A binary operator between numbers (`\\pm`, `\\times`) with its math spacing."""
    return Tex(rf"${{}}\{name}{{}}$", (("cmsy", name), ("em", MEDIUM_SPACE)))


def words(label: str) -> tuple[Tex, ...]:
    """A schema label's words: `eps`, `sigma`, `mu` as Greek letters, the rest as text."""
    return tuple(greek(GREEK[w]) if w in GREEK else text(w) for w in label.split(" "))


def number(digits: str, bold: bool = False) -> Tex:
    """A shown number as text. Bold keeps the width of the normal figures to the right of its decimal point
    (`\\rlap` over a `\\phantom`), so a bold number stays aligned on the decimal point."""
    if digits in ("inf", "-inf"):
        return Tex(r"$\infty$", (("cmsy", "infty"),))
    if not bold or "." not in digits:
        return Tex(rf"\textbf{{{digits}}}", (("cmbx", digits),)) if bold else text(digits)
    whole, fraction = digits.split(".", 1)
    return Tex(rf"\textbf{{{whole}}}\rlap{{\textbf{{.{fraction}}}}}\phantom{{.{fraction}}}",
               (("cmbx", whole), ("cmr", "." + fraction)))


NONE = text("--")


# Columns ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Column:
    """One column of the table (the utility is two tabular columns: mean, then `± std`). Headers are words
    (and the unit, `(MB)`) set on one line or two, whichever makes the column narrower."""

    header: str  # the schema's text-table header (its identity)
    full: tuple[Tex, ...]  # the header's words
    short: tuple[Tex, ...]  # abbreviated (explained in the legend when it differs)
    unit: str
    align: str  # tabular column spec
    cells: tuple[Tex, ...]  # one per row (rows of the board, in order)
    std: tuple[Tex, ...] = ()  # the utility's `± std` cells

    def body(self, size: int, fonts: str) -> float:
        return max([c.width(size, fonts) + (s.width(size, fonts) if self.std else 0.0)
                    for c, s in zip(self.cells, self.std or self.cells, strict=True)] + [0.0])

    def lines(self, size: int, abbreviated: bool, fonts: str) -> list[Tex]:
        tokens = list(self.short if abbreviated else self.full) + ([unit_tex(self.unit)] if self.unit else [])
        body = self.body(size, fonts)

        def joined(part: Sequence[Tex]) -> Tex:
            out = part[0]
            for t in part[1:]:
                out += text(" ") + t
            return out

        splits = [[joined(tokens)]] + [[joined(tokens[:i]), joined(tokens[i:])] for i in range(1, len(tokens))]
        return min(splits, key=lambda ls: (max([body] + [t.width(size, fonts) for t in ls]), len(ls)))

    def width(self, size: int, abbreviated: bool, fonts: str) -> float:
        return max([self.body(size, fonts)] + [t.width(size, fonts) for t in self.lines(size, abbreviated, fonts)])

    def label(self, abbreviated: bool) -> str:
        """The header's words on one line: joined by `~` (a legend never breaks inside "$\\varepsilon$~cert.")."""
        return "~".join(t.latex for t in (self.short if abbreviated else self.full))


def unit_tex(unit: str) -> Tex:
    """`(MB)`, `($\\times$)` for ratios, `(\\%)`."""
    glyph = (("cmsy", "times"),) if unit == "x" else (("cmr", unit),)
    return Tex(f"({UNITS.get(unit, escape(unit))})", (("cmr", "("),) + glyph + (("cmr", ")"),))


def _formatted(values: Sequence[float | None], f: schema.Field) -> tuple[Tex, ...]:
    """A column's numbers as every output writes the quantity (`--` for none)."""
    return tuple(NONE if v is None else number(schema.shown(v, f)) for v in values)


def _intervals(board: Sequence[LeaderboardRow]) -> tuple[Tex, ...]:
    """Each row's `step x` interval, ` (1.50--1.81)`, as every output writes its ends."""
    low, high = schema.field("metrics", "step_time_ratio_low"), schema.field("metrics", "step_time_ratio_high")
    return tuple(EMPTY if r.step_time_ratio_low is None or r.step_time_ratio_high is None else
                 text(" (") + number(schema.shown(r.step_time_ratio_low, low)) + text("--")
                 + number(schema.shown(r.step_time_ratio_high, high)) + text(")") for r in board)


def columns(board: Sequence[LeaderboardRow], headers: Sequence[str], metric: str,
            best: set[int], intervals: bool = False) -> list[Column]:
    """The columns of the text-table `headers` (schema order), their cells computed once for every size.
    `intervals`: `step x` with its 95% interval beside it (where the spread matters: the overhead columns)."""
    out = []
    bold = [i in best for i in range(len(board))]
    for header in headers:
        if header in LEAVE_OUT:
            continue
        f = schema.by_header(header)
        label, short, unit = f.label or header, f.abbr or f.label or header, f.unit
        align = "r"
        std: tuple[Tex, ...] = ()
        if header == "mechanism":
            cells, align = tuple(text(r.mechanism, "cmtt") for r in board), "l"
        elif header == "utility":
            u = schema.utility_field(metric)
            label, short, unit = metric.replace("_", " "), (u.abbr or metric).replace("_", " "), u.unit
            cells = tuple(NONE if r.utility_mean is None else number(schema.shown(r.utility_mean, u), bold[i])
                          for i, r in enumerate(board))
            std = tuple(EMPTY if r.utility_mean is None or r.utility_std is None or r.n_finished < 2 else
                        binary("pm") + number(schema.shown(r.utility_std, u), bold[i])
                        for i, r in enumerate(board))
            align = "r@{}l"
        elif header == "status":
            cells, align = tuple(text(status(r)) for r in board), "l"
        elif header == "step x" and intervals:
            cells, std, align = _formatted([r.step_time_ratio for r in board], f), _intervals(board), "r@{}l"
        elif header == "runs":
            cells = tuple(text(f"{r.n_finished}" + (f" ({r.n_failed} failed)" if r.n_failed else "")) for r in board)
        elif header == "mu claimed/audited":
            claimed, audited = schema.field("privacy", "mu_claimed"), schema.field("privacy", "mu_audited")
            c_cells = _formatted([r.mu_claimed if r.mu_audited is not None else None for r in board], claimed)
            a_cells = _formatted([r.mu_audited for r in board], audited)
            cells = tuple(NONE if r.mu_audited is None else c + text("/") + a
                          for r, c, a in zip(board, c_cells, a_cells, strict=True))
        elif bool in (f.type if isinstance(f.type, tuple) else (f.type,)):  # a flag
            cells = tuple(NONE if v is None else text("yes" if v else "no") for v in (getattr(r, f.column)
                                                                                      for r in board))
        elif str in (f.type if isinstance(f.type, tuple) else (f.type,)):  # words (`violation`)
            cells, align = tuple(NONE if v is None else text(v) for v in (getattr(r, f.column) for r in board)), "l"
        else:
            cells = _formatted([getattr(r, f.column) for r in board], f)
        out.append(Column(header, words(label), words(short), unit, align, cells, std))
    return out


# Layout -----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Layout:
    size: int
    fonts: str  # a key of FONTS
    abbreviated: bool
    separation: float
    parts: tuple[tuple[Column, ...], ...]
    width: float  # the widest part's natural width, points


def part_width(part: Sequence[Column], size: int, fonts: str, abbreviated: bool, separation: float,
               titles: Sequence[Tex]) -> float:
    """The tabular's natural width: its columns with \\tabcolsep on each side, none at the outer edges
    (`@{}`), at least as wide as its block titles."""
    body = sum(c.width(size, abbreviated, fonts) for c in part) + 2 * separation * (len(part) - 1)
    return max([body] + [t.width(size, fonts) for t in titles])


def layout(variants: dict[bool, Sequence[Column]], width: float, venue: Venue, titles: Sequence[Tex]) -> Layout:
    """The most readable layout within `width` points: one table if any size fits it (largest size first,
    full headers before abbreviated ones, normal spacing before tight), else the fewest stacked parts.
    `variants`: the columns with full (False) and abbreviated (True) headers and statuses."""
    width -= MARGIN
    best: Layout | None = None
    fonts = venue.fonts
    for size in [s for s in SIZES if s <= venue.font_pt] or [min(SIZES)]:
        for abbreviated in (False, True):
            keys = [c for c in variants[abbreviated] if c.header in KEY_COLUMNS]
            rest = [c for c in variants[abbreviated] if c.header not in KEY_COLUMNS]
            for sep in SEPARATIONS:
                parts: list[list[Column]] = [list(keys)]
                for c in rest:
                    if len(parts[-1]) > len(keys) and part_width(parts[-1] + [c], size, fonts, abbreviated, sep,
                                                                titles) > width:
                        parts.append(list(keys))
                    parts[-1].append(c)
                widest = max(part_width(p, size, fonts, abbreviated, sep, titles) for p in parts)
                candidate = Layout(size, fonts, abbreviated, sep, tuple(tuple(p) for p in parts), widest)
                if widest <= width and len(parts) == 1:
                    return candidate
                if best is None or (widest <= width, -len(parts)) > (best.width <= width, -len(best.parts)):
                    best = candidate
    assert best is not None
    return best


# Writing ----------------------------------------------------------------------------------------------------
def _header_cell(lines: Sequence[Tex], align: str) -> str:
    if len(lines) == 1:
        return lines[0].latex
    side = "l" if align.startswith("l") else "r"
    return rf"\begin{{tabular}}[b]{{@{{}}{side}@{{}}}}" + r"\\".join(t.latex for t in lines) + r"\end{tabular}"


def _tabular(part: Sequence[Column], lay: Layout, board: Sequence[LeaderboardRow],
             group_of: Callable[[LeaderboardRow], tuple], order: Sequence[int],
             width: float | None = None) -> list[str]:
    """One booktabs tabular; `width` (points): a `tabular*` of that width whose column gaps stretch, so the
    parts of a split table are equally wide."""
    spans = sum(2 if c.std else 1 for c in part)
    head = []
    for c in part:
        cell = _header_cell(c.lines(lay.size, lay.abbreviated, lay.fonts), c.align)
        head.append(rf"\multicolumn{{2}}{{c}}{{{cell}}}" if c.std else cell)
    spec = "".join(c.align for c in part)
    begin = (r"\begin{tabular}{@{}" + spec + "@{}}" if width is None else
             rf"\begin{{tabular*}}{{{width:.2f}pt}}{{@{{\extracolsep{{\fill}}}}{spec}@{{}}}}")
    lines = [begin, r"\toprule",
             " & ".join(head) + r" \\", r"\midrule"]
    seen: list[tuple] = []
    for i in order:
        group = group_of(board[i])
        if group not in seen:
            if seen:
                lines.append(r"\midrule")
            seen.append(group)
            title = " / ".join(str(g) for g in group if g)
            lines.append(rf"\multicolumn{{{spans}}}{{@{{}}l}}{{{text(title, 'cmti').latex}}} \\")
        cells = []
        for c in part:
            cells.append(c.cells[i].latex)
            if c.std:
                cells.append(c.std[i].latex)
        lines.append(" & ".join(cells) + r" \\")
    return lines + [r"\bottomrule", r"\end{tabular}" if width is None else r"\end{tabular*}"]


def _legend(lay: Layout, part: Sequence[Column], metric: str, board: Sequence[LeaderboardRow], best: set[int]) -> str:
    """What a part's abbreviations, units and bold cells mean, under that part (a split table's parts may be read
    on different pages)."""
    notes = []
    if lay.abbreviated:
        notes += [f"{c.label(True)}: {c.label(False)}" for c in part if c.short != c.full]
        used = sorted({r.claim_status for r in board if r.claim_status in STATUS_ABBR})
        notes += [f"{STATUS_ABBR[s]}: {s}" for s in used if any(c.header == "status" for c in part)]
    if any(c.unit == "x" for c in part):
        notes.append(r"($\times$): relative to non-private")
    if any(c.header == "step x" and any(t.latex for t in c.std) for c in part):
        notes.append(r"step time (a--b): its 95\% interval")
    if best and any(c.header == "utility" for c in part):
        notes.append(rf"bold: best private {escape(metric.replace('_', ' '))} among rows with status ok at each "
                     r"target $\varepsilon$")
    return "; ".join(notes) + ("." if notes else "")


LABEL_NEEDS_CAPTION = ("--label needs --caption: LaTeX's \\ref to a label in a float without a caption gives the "
                       "number of the section around it, not the table's")


def continued(n: int, caption: str, label: str | None) -> list[str]:
    """The caption of part `n` (from 0) of a split table in floats: one numbered table, its later parts
    `(continued)` under the same number (the counter stepped back: no package needed), the label on the first."""
    if n == 0:
        return [rf"\caption{{{caption}}}"] + ([rf"\label{{{label}}}"] if label else [])
    return [r"\addtocounter{table}{-1}", rf"\caption{{{caption} (continued)}}"]


def _legend_box(legend: str, width: float) -> list[str]:
    """The legend in a box as wide as its table (never wider, never broken across columns or pages)."""
    return [r"\par\smallskip", rf"\noindent\parbox[t]{{{width:.2f}pt}}{{\raggedright {legend}\par}}"]


def status(r: LeaderboardRow, abbreviated: bool = False) -> str:
    """The claim status (why a row is violated is the `violation` column, in words)."""
    name = r.claim_status or "--"
    return STATUS_ABBR.get(name, name) if abbreviated else name


def _abbreviate_statuses(cols: Sequence[Column], board: Sequence[LeaderboardRow]) -> list[Column]:
    return [dataclasses.replace(c, cells=tuple(text(status(r, True)) for r in board)) if c.header == "status" else c
            for c in cols]


def best_utility(board: Sequence[LeaderboardRow]) -> set[int]:
    """Indices of the rows in bold: the highest mean utility among the `ok` rows (`honest`) of each (sweep,
    dataset, model, target epsilon) group of two private rows or more (a lone private row is best of nothing,
    and a table of one private mechanism would be bold throughout). An overclaimed row with more utility is
    never bold: it is shown, its status in words."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(board):
        if r.private and r.utility_mean is not None:
            groups.setdefault((r.sweep, r.dataset, r.model, r.epsilon_target), []).append(i)
    return {max(ok, key=lambda i: board[i].utility_mean) for members in groups.values() if len(members) > 1
            for ok in [[i for i in members if honest(board[i])]] if ok}


def resolve_width(width: str | float, venue: Venue) -> float:
    """`single`, `double` (the venue's column or text width) or a number of points."""
    if isinstance(width, str) and width in WIDTHS:
        return venue.width_pt(width)
    try:
        points = float(width)
    except ValueError:
        raise ValueError(f"unknown width {width!r}; known: {', '.join(WIDTHS)} or a number of points") from None
    if not 100 <= points <= 1000:
        raise ValueError(f"width {points:g} pt is not a paper's column or text width (100 to 1000 pt)")
    return points


def latex(board: Sequence[LeaderboardRow], headers: Sequence[str], venue: Venue, metric: str = "accuracy",
          width: str | float = "single", float_env: str = "none", caption: str | None = None,
          label: str | None = None, intervals: bool = False) -> str:
    """The table(s) for `width` at `venue`: one booktabs tabular, or stacked ones repeating the key columns;
    in a `table` / `table*` float with `caption` and `label` when asked. `headers`: the text-table
    headers of the chosen columns, in order (dashboards/render.py picks them)."""
    if float_env not in FLOATS:
        raise ValueError(f"unknown float {float_env!r}; known: {', '.join(FLOATS)}")
    if (caption or label) and float_env == "none":
        raise ValueError("--caption and --label need a float: --float table or --float 'table*'")
    if label and not caption:
        raise ValueError(LABEL_NEEDS_CAPTION)
    points = resolve_width(width, venue)
    multi = len({r.sweep for r in board}) > 1

    def group_of(r: LeaderboardRow) -> tuple:
        return (r.sweep, r.dataset, r.model) if multi else (r.dataset, r.model)

    firsts = list(dict.fromkeys(group_of(r) for r in board))
    order = sorted(range(len(board)), key=lambda i: firsts.index(group_of(board[i])))  # stable: keeps the rank
    titles = [text(" / ".join(str(g) for g in group if g), "cmti") for group in firsts]
    best = best_utility(board)
    cols = columns(board, headers, metric, best, intervals)
    lay = layout({False: cols, True: _abbreviate_statuses(cols, board)}, points, venue, titles)
    what = f"{width} width" if isinstance(width, str) and width in WIDTHS else "width"
    parts = len(lay.parts)
    floats = f", one {float_env} each" if float_env != "none" and parts > 1 else ""
    lines = [f"% privbench leaderboard for {venue.description}: {what} {points:g} pt, set in {lay.size} pt"
             f" ({parts} part{'s' if parts > 1 else ''}{floats}).",
             "% Needs " + " and ".join(rf"\usepackage{{{p}}}" for p in PACKAGES) + "."]
    font = (rf"\begingroup\fontsize{{{lay.size}}}{{{lay.size * LINE_SPACING:g}}}\selectfont"
            rf"\setlength{{\tabcolsep}}{{{lay.separation:g}pt}}%")
    for n, part in enumerate(lay.parts):
        if float_env != "none":  # each part its own float: a stack of parts may be taller than a page
            lines += [rf"\begin{{{float_env}}}[t]", r"\centering"]
            if caption:  # the user's LaTeX, as written (it may hold math)
                lines += [*continued(n, caption, label), r"\smallskip"]
            lines.append(font)
        else:  # a paragraph of its own, apart from the text above (also when \input right after a line)
            lines += [r"\par\medskip", *([font] if n == 0 else []), r"\noindent"]
        table = min(lay.width + MARGIN, points) if parts > 1 else part_width(part, lay.size, lay.fonts,
                                                                                lay.abbreviated, lay.separation, titles)
        lines += _tabular(part, lay, board, group_of, order, table if parts > 1 else None)
        legend = _legend(lay, part, metric, board, best)
        if legend:
            lines += _legend_box(legend, table)
        if float_env != "none":
            lines += [r"\par\endgroup", rf"\end{{{float_env}}}"]
    if float_env == "none":
        lines += [r"\par\endgroup", r"\medskip"]
    return "\n".join(lines) + "\n"
