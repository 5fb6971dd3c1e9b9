"""One person's data: ``define_subject``, ``subject_erase``, ``subject_export``,
``subject_proof``.

A subject is a plain value: the person's table, its key columns, a treatment for
every table the person reaches, and ``columns=`` for tables that hold the key
without a foreign key. The reach is walked from PostgreSQL's catalog
(``pg_constraint``) each time it is needed (a run, ``trio-jobs verify``, a
proof), so a table added next month is ``X_SUBJECT_TABLE_UNDECLARED`` until it
has a treatment. The walk leaves the person's table through every foreign key
that points at it, and leaves any other table only when that table is deleted:
the likes on a retained post are not the person's.

A plan (:func:`plan_subject`) is a list of operations, each a paged statement
run until a page comes back short: first the keys that close a loop of deleted
tables are cleared (set to ``NULL`` where they point at a row being erased),
then every table is deleted or anonymized children first, the person's own
table last. A row is found by a chain of equality ``IN`` subqueries from the
person's key, so a page never depends on a page before it: a table's rows are
its reach, and the rows already handled have left it (deleted, cleared, or
carrying the anonymized values already).
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs
import orjson

from ._context import _call
from ._declare import Job, Retry, job
from ._enqueue import _MISSING
from ._export_rows import render
from .errors import ErrorCode, JobDeclarationError, JobsError

if TYPE_CHECKING:
    from ._context import JobContext
    from ._facade import Jobs
    from ._settled import Settled

__all__ = [
    "PAGE_ROWS",
    "Anonymize",
    "Retain",
    "Subject",
    "SubjectFault",
    "define_subject",
    "plan_subject",
    "subject_erase",
    "subject_export",
    "subject_proof",
]

#: Rows per page: one statement (and, in a job, one step) each.
PAGE_ROWS = 500
MAX_NAME = 200

Execute = Callable[[str, Mapping[str, Any]], Awaitable[builtins.list[tuple[Any, ...]]]]


# ----------------------------------------------------------------------------- treatments


def _values(raw: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise JobsError(
            ErrorCode.X_SUBJECT_TREATMENT_INVALID,
            "Anonymize takes a mapping of column name to the value it is set to, "
            'e.g. Anonymize({"email": "erased@example.invalid", "name": ""})',
        )
    return dict(raw)


@attrs.frozen
class Anonymize:
    """Keep the rows, set these columns to these values (``None``: ``NULL``).

    >>> Anonymize({"email": "erased@example.invalid", "name": ""})
    """

    values: Mapping[str, Any] = attrs.field(converter=_values)


@attrs.frozen
class Retain:
    """Keep the rows as they are, for the reason given (the export's index says it).

    >>> Retain("published work belongs to the org")
    """

    reason: str


Treatment = Literal["delete"] | Anonymize | Retain


def _treatment_name(t: Treatment) -> str:
    return "delete" if t == "delete" else "anonymize" if isinstance(t, Anonymize) else "retain"


@attrs.frozen(eq=False)
class Subject:
    """What :func:`define_subject` answers: a plain value the subject factories,
    :func:`subject_proof` and ``trio-jobs verify`` take."""

    table: str
    key: tuple[str, ...]
    tables: Mapping[str, Treatment]
    columns: Mapping[str, tuple[str, ...]]


def _text_fault(value: object) -> bool:
    return not isinstance(value, str) or not value.strip() or "\x00" in value


def define_subject(
    table: str,
    *,
    key: str | Sequence[str],
    tables: Mapping[str, Treatment],
    columns: Mapping[str, str | Sequence[str]] | None = None,
) -> Subject:
    """Declare the person once: their ``table``, its ``key`` column (or columns,
    e.g. ``("tenant_id", "id")``), and a treatment for every table that holds
    something of theirs: ``"delete"``, :class:`Anonymize` or :class:`Retain`.
    The person's own table needs one too. Nothing defaults.

    ``columns={"audit_copies": "member_id"}`` names a table that holds the key
    without a foreign key (the catalog cannot see it); it needs a treatment too.

    A malformed declaration is ``X_SUBJECT_TREATMENT_INVALID`` (a listed table
    without a treatment: ``X_SUBJECT_TABLE_UNDECLARED``), naming every fault.
    What needs the database (a table or column that does not exist, ``None``
    for a not-null column, a kept row under a deleted parent, a loop) is
    checked by ``trio-jobs verify`` and before a run's first write.

    >>> members = define_subject(
    ...     "members",
    ...     key="id",
    ...     tables={
    ...         "members": Anonymize({"email": "erased@example.invalid", "name": ""}),
    ...         "posts": Retain("published work belongs to the org"),
    ...         "comments": "delete",
    ...     },
    ... )
    """
    faults: list[str] = []
    undeclared: list[str] = []
    if _text_fault(table):
        faults.append("table must be the person's table name (a non-empty string)")
    keys: tuple[str, ...] = ()
    if isinstance(key, str):
        keys = (key,)
    elif isinstance(key, Sequence) and key:
        keys = tuple(key)
    if not keys or any(_text_fault(k) for k in keys) or len(set(keys)) != len(keys):
        faults.append(
            "key must name the person's key column, or a sequence of distinct columns "
            '(e.g. ("tenant_id", "id"))'
        )
    checked: dict[str, Treatment] = {}
    if not isinstance(tables, Mapping) or not tables:
        faults.append(
            "tables must map every table the person reaches to 'delete', "
            "Anonymize({...}) or Retain('why')"
        )
    else:
        for name, treatment in tables.items():
            if _text_fault(name):
                faults.append("tables: every key must be a table name (a non-empty string)")
                continue
            if treatment == "delete":
                checked[name] = "delete"
            elif isinstance(treatment, Anonymize):
                if not treatment.values:
                    faults.append(f"{name}: Anonymize names no column (list what it sets)")
                elif any(_text_fault(c) for c in treatment.values):
                    faults.append(f"{name}: Anonymize's keys must be column names")
                else:
                    checked[name] = treatment
            elif isinstance(treatment, Retain):
                if _text_fault(treatment.reason):
                    faults.append(f"{name}: Retain needs a reason (why the rows are kept)")
                else:
                    checked[name] = treatment
            else:
                faults.append(
                    f"{name}: the treatment must be 'delete', Anonymize({{col: value}}) or "
                    f"Retain('why'), not a {type(treatment).__name__}"
                )
    cols: dict[str, tuple[str, ...]] = {}
    if columns is not None:
        if not isinstance(columns, Mapping):
            faults.append('columns must map a table to its key column(s): {"audit": "member_id"}')
        else:
            for name, col in columns.items():
                these = (col,) if isinstance(col, str) else tuple(col) if col else ()
                if _text_fault(name) or not these or any(_text_fault(c) for c in these):
                    faults.append(f"columns: {name!r} must map to its key column(s)")
                    continue
                if keys and len(these) != len(keys):
                    faults.append(
                        f"columns: {name} names {len(these)} column(s) for a key of {len(keys)}"
                    )
                    continue
                if isinstance(tables, Mapping) and name not in tables:
                    undeclared.append(f"columns: {name} has no treatment in tables=")
                cols[name] = these
    if faults or undeclared:
        code = (
            ErrorCode.X_SUBJECT_TREATMENT_INVALID
            if faults
            else ErrorCode.X_SUBJECT_TABLE_UNDECLARED
        )
        every = faults + undeclared
        raise JobDeclarationError(
            code, "define_subject is invalid: " + "; ".join(every), meta={"faults": every}
        )
    return Subject(table=table, key=keys, tables=checked, columns=cols)


# ----------------------------------------------------------------------------- the plan


@attrs.frozen
class SubjectFault:
    """One thing ``trio-jobs verify`` (and a run, before its first write) refuses."""

    code: ErrorCode
    table: str
    message: str


@attrs.frozen
class _Edge:
    child: int
    child_cols: tuple[str, ...]
    parent: int
    parent_cols: tuple[str, ...]
    #: The columns whose NULL frees a row from this key (MATCH SIMPLE: any
    #: nullable one does, so all of those are cleared; MATCH FULL: all or none).
    clearable: tuple[str, ...]
    via: str  # the constraint's name, or "columns="


@attrs.frozen
class _Column:
    name: str
    not_null: bool
    type: str
    has_default: bool


@attrs.frozen
class Operation:
    """One paged statement of a plan: ``sql`` (named parameters, the person's key
    among them) answers the count of rows it touched, at most ``PAGE_ROWS``."""

    kind: Literal["clear", "delete", "anonymize"]
    table: str
    label: str
    sql: str
    params: Mapping[str, Any]


@attrs.frozen
class Plan:
    """The reach and what happens to it. ``tables`` lists every reached table
    children first (the person's last) with its treatment."""

    subject: Subject
    tables: tuple[tuple[str, Treatment], ...]
    operations: tuple[Operation, ...]
    # Every reached table's reach condition over the alias ``x`` (for export and proof).
    reach: Mapping[str, str]
    oids: Mapping[str, int]
    edges: tuple[_Edge, ...]
    names: Mapping[int, str]
    sql_names: Mapping[int, str]
    columns: Mapping[int, tuple[_Column, ...]]
    #: The reached tables that are partitioned (relkind ``p``).
    partitioned: frozenset[int] = frozenset()


_FKS = """
SELECT c.conrelid::oid::int8, c.confrelid::oid::int8, c.conname::text,
       array(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(n, i)
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.i),
       array(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY k(n, i)
             JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n ORDER BY k.i),
       array(SELECT a.attname::text FROM unnest(c.conkey) k(n)
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n
             WHERE NOT a.attnotnull),
       c.confmatchtype = 'f'
FROM pg_constraint c
WHERE c.contype = 'f' AND c.conparentid = 0
  AND c.connamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
ORDER BY c.conrelid, c.conname
"""

_COLUMNS = """
SELECT a.attrelid::oid::int8, a.attname::text, a.attnotnull,
       format_type(a.atttypid, a.atttypmod),
       a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> ''
FROM pg_attribute a
WHERE a.attrelid = ANY(%(oids)s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum
"""

_RESOLVE = """
SELECT n, c.oid::int8, c.oid::regclass::text, c.relkind::text
FROM unnest(%(names)s::text[]) n LEFT JOIN pg_class c ON c.oid = to_regclass(n)
"""


def ident(name: str) -> str:
    """A column name quoted for SQL (names come from the catalog or were checked against it)."""
    return '"' + name.replace('"', '""') + '"'


def _tuple(cols: Iterable[str], alias: str) -> str:
    return "(" + ", ".join(f"{alias}.{ident(c)}" for c in cols) + ")"


def key_values(subject: Subject, value: Any) -> dict[str, Any]:
    """The person's key as named parameters (``k0``, ``k1``, ...), checked for shape."""
    values = (
        tuple(value)
        if len(subject.key) > 1 and isinstance(value, tuple | builtins.list)
        else (value,)
    )
    if len(values) != len(subject.key) or any(v is None for v in values):
        raise JobsError(
            ErrorCode.X_JOB_DECLARATION_INVALID,
            f"the subject {subject.table!r} has a key of {len(subject.key)} column(s) "
            f"({', '.join(subject.key)}); key= must answer "
            + ("one value" if len(subject.key) == 1 else f"a tuple of {len(subject.key)} values")
            + ", none of them None",
        )
    return {f"k{i}": v for i, v in enumerate(values)}


async def plan_subject(
    execute: Execute, subject: Subject
) -> tuple[Plan | None, builtins.list[SubjectFault]]:
    """Walk the catalog from the person's table: the plan, or every fault found.

    ``execute(sql, params)`` runs one statement (a transaction's ``execute``)."""
    faults: list[SubjectFault] = []

    def fault(code: ErrorCode, table: str, message: str) -> None:
        faults.append(SubjectFault(code, table, message))

    declared = [subject.table, *subject.tables, *subject.columns]
    names: list[str] = list(dict.fromkeys(declared))
    oid_of: dict[str, int] = {}
    name_of: dict[int, str] = {}
    sql_of: dict[int, str] = {}  # the table as SQL names it (regclass text)
    partitioned: set[int] = set()  # relkind 'p': a ctid names a row only with its tableoid
    for given, oid, text, kind in await execute(_RESOLVE, {"names": names}):
        if oid is None:
            fault(ErrorCode.X_SUBJECT_TREATMENT_INVALID, given, f"no table {given} (search_path)")
        elif kind not in ("r", "p"):
            fault(ErrorCode.X_SUBJECT_TREATMENT_INVALID, given, f"{given} is not a table")
        else:
            oid_of[given] = int(oid)
            name_of.setdefault(int(oid), given)
            sql_of[int(oid)] = text
            if kind == "p":
                partitioned.add(int(oid))
    root = oid_of.get(subject.table)
    if root is None:
        return None, faults
    treatments: dict[int, Treatment] = {
        oid_of[n]: t for n, t in subject.tables.items() if n in oid_of
    }

    edges: list[_Edge] = []
    for child, parent, con, ccols, pcols, nullable, full in await execute(_FKS, {}):
        clearable = tuple(nullable) if not full or len(nullable) == len(ccols) else ()
        edges.append(_Edge(int(child), tuple(ccols), int(parent), tuple(pcols), clearable, con))
    involved = {e.child for e in edges} | {e.parent for e in edges} | set(oid_of.values())
    columns: dict[int, list[_Column]] = {}
    for rel, col, not_null, typ, has_default in await execute(_COLUMNS, {"oids": sorted(involved)}):
        columns.setdefault(int(rel), []).append(_Column(col, not_null, typ, has_default))

    def cols_of(oid: int) -> dict[str, _Column]:
        return {c.name: c for c in columns.get(oid, [])}

    missing = [k for k in subject.key if k not in cols_of(root)]
    if missing:
        fault(
            ErrorCode.X_SUBJECT_TREATMENT_INVALID,
            subject.table,
            f"key: {subject.table} has no column {', '.join(missing)}",
        )
    for name, these in subject.columns.items():
        oid = oid_of.get(name)
        if oid is None:
            continue
        unknown = [c for c in these if c not in cols_of(oid)]
        if unknown:
            fault(
                ErrorCode.X_SUBJECT_TREATMENT_INVALID,
                name,
                f"columns: {name} has no column {', '.join(unknown)}",
            )
            continue
        nullable = tuple(c for c in these if not cols_of(oid)[c].not_null)
        edges.append(_Edge(oid, these, root, subject.key, nullable, "columns="))
    for name, treatment in subject.tables.items():
        oid = oid_of.get(name)
        if oid is None or not isinstance(treatment, Anonymize):
            continue
        known = cols_of(oid)
        unknown = sorted(c for c in treatment.values if c not in known)
        if unknown:
            fault(
                ErrorCode.X_SUBJECT_TREATMENT_INVALID,
                name,
                f"{name}: Anonymize names unknown column(s) {', '.join(unknown)}",
            )
        nulls = sorted(
            c for c, v in treatment.values.items() if v is None and c in known and known[c].not_null
        )
        if nulls:
            fault(
                ErrorCode.X_SUBJECT_TREATMENT_INVALID,
                name,
                f"{name}: Anonymize sets not-null column(s) {', '.join(nulls)} to None",
            )

    def label(oid: int) -> str:
        if oid not in name_of:
            name_of[oid] = str(oid)
        return name_of[oid]

    # Names for tables the walk finds that the declaration does not list.
    unnamed = sorted({e.child for e in edges} - set(name_of))
    if unnamed:
        for oid, text in await execute(
            "SELECT o::int8, o::regclass::text FROM unnest(%(oids)s::oid[]) o",
            {"oids": unnamed},
        ):
            name_of[int(oid)] = sql_of[int(oid)] = text

    def walked(oid: int) -> bool:
        return oid == root or treatments.get(oid) == "delete"

    by_parent: dict[int, list[_Edge]] = {}
    for e in edges:
        by_parent.setdefault(e.parent, []).append(e)
    reached: list[int] = [root]
    seen = {root}
    walk_edges: list[_Edge] = []
    queue = [root]
    while queue:
        parent = queue.pop(0)
        if not walked(parent):
            continue
        for e in by_parent.get(parent, []):
            if e.child not in treatments:
                if e.child not in seen:
                    seen.add(e.child)
                    fault(
                        ErrorCode.X_SUBJECT_TABLE_UNDECLARED,
                        label(e.child),
                        f"{label(e.child)} is reached ({label(e.child)}."
                        f"{','.join(e.child_cols)} -> {label(e.parent)}) and has no treatment: "
                        "add 'delete', Anonymize({...}) or Retain('why') to tables=",
                    )
                continue
            walk_edges.append(e)
            if e.child not in seen:
                seen.add(e.child)
                reached.append(e.child)
                queue.append(e.child)
    if root not in treatments:
        fault(
            ErrorCode.X_SUBJECT_TABLE_UNDECLARED,
            subject.table,
            f"{subject.table} (the person's own table) has no treatment in tables=",
        )

    # Loops among walked tables: break each at a nullable key (cleared first).
    cyclic = [e for e in walk_edges if walked(e.child)]
    clears: list[_Edge] = []
    while (loop := _find_loop(cyclic)) is not None:
        breakable = [e for e in reversed(loop) if e.clearable]
        if not breakable:
            tables = " -> ".join(label(e.parent) for e in loop) + f" -> {label(loop[-1].child)}"
            fault(
                ErrorCode.X_SUBJECT_CYCLE,
                label(loop[0].parent),
                f"the deleted tables loop ({tables}) with no nullable key to clear first: "
                "make one foreign key of the loop nullable, or keep one table of it",
            )
            for e in loop:
                cyclic.remove(e)
            continue
        cut = breakable[0]
        clears.append(cut)
        cyclic.remove(cut)
    dag = [e for e in walk_edges if e not in clears]

    # A kept row under a deleted parent.
    for e in dag:
        if walked(e.child) or not (e.parent != root or treatments.get(root) == "delete"):
            continue
        if e.via == "columns=":
            continue  # no constraint: a kept row neither blocks the delete nor cascades
        kept = treatments[e.child]
        cleared = (
            isinstance(kept, Anonymize)
            and bool(e.clearable)
            and all(c in kept.values and kept.values[c] is None for c in e.clearable)
        )
        if not cleared:
            fault(
                ErrorCode.X_SUBJECT_TREATMENT_INVALID,
                label(e.child),
                f"{label(e.child)} keeps rows under {label(e.parent)}, which is deleted "
                f"({label(e.child)}.{','.join(e.child_cols)}): treat it 'delete', or "
                "Anonymize its nullable key column(s) to None"
                + (f" ({', '.join(repr(c) for c in e.clearable)}: None)" if e.clearable else ""),
            )
    if faults:
        return None, faults

    # Children first, the person's table last.
    kids: dict[int, list[int]] = {}
    for e in dag:
        kids.setdefault(e.parent, []).append(e.child)
    order: list[int] = []
    done: set[int] = set()

    def visit(oid: int) -> None:
        done.add(oid)
        for k in kids.get(oid, []):
            if k not in done:
                visit(k)
        order.append(oid)

    visit(root)
    into: dict[int, list[_Edge]] = {}
    for e in dag:
        into.setdefault(e.child, []).append(e)

    def cond(oid: int, alias: str, depth: int) -> str:
        if oid == root:
            return " AND ".join(f"{alias}.{ident(k)} = %(k{i})s" for i, k in enumerate(subject.key))
        inner = f"t{depth + 1}"
        parts = [
            f"{_tuple(e.child_cols, alias)} IN (SELECT {', '.join(f'{inner}.{ident(c)}' for c in e.parent_cols)} "
            f"FROM {sql_of[e.parent]} {inner} WHERE {cond(e.parent, inner, depth + 1)})"
            for e in into[oid]
        ]
        return parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"

    ops: list[Operation] = []
    used: set[str] = set()

    def add(
        kind: Literal["clear", "delete", "anonymize"],
        oid: int,
        lab: str,
        sql: str,
        params: Mapping[str, Any],
    ) -> None:
        n, base = 1, lab
        while lab in used:
            n += 1
            lab = f"{base}#{n}"
        used.add(lab)
        ops.append(Operation(kind, label(oid), lab, sql, params))

    for e in clears:
        t, q = label(e.child), sql_of[e.child]
        where = (
            f"{_tuple(e.child_cols, 'x')} IN (SELECT "
            f"{', '.join(f't1.{ident(c)}' for c in e.parent_cols)} FROM {sql_of[e.parent]} t1 "
            f"WHERE {cond(e.parent, 't1', 1)})"
        )
        sets = ", ".join(f"{ident(c)} = NULL" for c in e.clearable)
        add(
            "clear",
            e.child,
            f"clear:{t}.{','.join(e.clearable)}",
            _paged(f"UPDATE {q} SET {sets}", q, where, e.child in partitioned),
            {},
        )
    reach: dict[str, str] = {}
    tables_out: list[tuple[str, Treatment]] = []
    for oid in order:
        t, q = label(oid), sql_of[oid]
        where = cond(oid, "x", 0)
        reach[t] = where
        treatment = treatments[oid]
        tables_out.append((t, treatment))
        if treatment == "delete":
            add(
                "delete",
                oid,
                f"delete:{t}",
                _paged(f"DELETE FROM {q}", q, where, oid in partitioned),
                {},
            )
        elif isinstance(treatment, Anonymize):
            types = cols_of(oid)
            params: dict[str, Any] = {}
            sets_l: list[str] = []
            targets: list[str] = []
            for i, (c, v) in enumerate(sorted(treatment.values.items())):
                typ = types[c].type
                params[f"a{i}"] = v
                sets_l.append(f"{ident(c)} = %(a{i})s::{typ}")
                targets.append(f"%(a{i})s::{typ}")
            cols_l = [c for c, _ in sorted(treatment.values.items())]
            pending = f"{_tuple(cols_l, 'x')} IS DISTINCT FROM ({', '.join(targets)})"
            add(
                "anonymize",
                oid,
                f"anonymize:{t}",
                _paged(
                    f"UPDATE {q} SET {', '.join(sets_l)}",
                    q,
                    f"{where} AND {pending}",
                    oid in partitioned,
                ),
                params,
            )
    plan = Plan(
        subject=subject,
        tables=tuple(tables_out),
        operations=tuple(ops),
        reach=reach,
        oids={label(o): o for o in order},
        sql_names=dict(sql_of),
        edges=tuple(dag),
        names=dict(name_of),
        columns={o: tuple(c) for o, c in columns.items()},
        partitioned=frozenset(partitioned),
    )
    return plan, []


def _paged(head: str, table: str, where: str, partitioned: bool = False) -> str:
    """One page of ``head`` (an UPDATE ... SET or a DELETE) over the rows ``where``
    holds, answering how many it touched.

    A row is named by its ``ctid`` (a TID scan finds the page's rows again).
    In a partitioned table a ``ctid`` is a partition's: the same one names a
    row in each partition, so the page is named by ``(tableoid, ctid)`` pairs
    (the ``ctid`` list still lets each partition's scan find them by TID)."""
    if not partitioned:
        return (
            f"WITH hit AS ({head} WHERE ctid = ANY(ARRAY(SELECT x.ctid FROM {table} x "
            f"WHERE {where} LIMIT {PAGE_ROWS})) RETURNING 1) SELECT count(*) FROM hit"
        )
    return (
        f"WITH pick AS MATERIALIZED (SELECT x.tableoid AS t, x.ctid AS c FROM {table} x "
        f"WHERE {where} LIMIT {PAGE_ROWS}), "
        f"hit AS ({head} WHERE ctid = ANY(ARRAY(SELECT c FROM pick)) "
        "AND (tableoid, ctid) IN (SELECT t, c FROM pick) RETURNING 1) "
        "SELECT count(*) FROM hit"
    )


def _find_loop(edges: Sequence[_Edge]) -> builtins.list[_Edge] | None:
    """A loop among ``edges`` (parent -> child), as its edges in order, or ``None``."""
    out: dict[int, list[_Edge]] = {}
    for e in edges:
        out.setdefault(e.parent, []).append(e)
    state: dict[int, int] = {}
    path: list[_Edge] = []

    def dfs(node: int) -> list[_Edge] | None:
        state[node] = 1
        for e in out.get(node, []):
            if state.get(e.child) == 1:
                start = next((i for i, p in enumerate(path) if p.parent == e.child), len(path))
                return [*path[start:], e]
            if e.child not in state:
                path.append(e)
                found = dfs(e.child)
                if found is not None:
                    return found
                path.pop()
        state[node] = 2
        return None

    for node in list(out):
        if node not in state:
            found = dfs(node)
            if found is not None:
                return found
    return None


def refusal(subject: Subject, faults: Sequence[SubjectFault]) -> JobsError:
    """One ``JobsError`` for a plan's faults: the first fault's code, every message."""
    return JobsError(
        faults[0].code,
        f"the subject {subject.table!r} cannot be erased as declared (nothing was written): "
        + "; ".join(f.message for f in faults),
        meta={"faults": [{"code": str(f.code), "table": f.table} for f in faults]},
    )


async def planned(execute: Execute, subject: Subject) -> Plan:
    """:func:`plan_subject`, a refusal raised."""
    plan, faults = await plan_subject(execute, subject)
    if plan is None:
        raise refusal(subject, faults)
    return plan


async def run_operation(execute: Execute, op: Operation, key: Mapping[str, Any]) -> int:
    """One page of ``op``: the rows it touched."""
    [(count,)] = await execute(op.sql, {**op.params, **key})
    return int(count)


# ----------------------------------------------------------------------------- the jobs


async def _postgres(jobs: Jobs, what: str) -> None:
    """Refuse a queue that is not PostgreSQL's with the app's tables beside it."""
    driver = await jobs._resolved_driver()
    if driver.name != "postgres" or jobs.outbox is not None:
        raise JobsError(
            ErrorCode.X_NOT_IMPLEMENTED,
            f"{what} is PostgreSQL only: it walks the catalog's foreign keys and writes "
            "each page with its step record in one transaction; open the jobs with "
            "postgres_driver(dsn) on the app's database",
        )


def _check_subject_fields(
    kind: str, subject: Any, key: Any, faults: list[str], unknown: Mapping[str, Any]
) -> None:
    if unknown:
        faults.append(f"unknown field(s): {', '.join(sorted(unknown))}")
    if not isinstance(subject, Subject):
        faults.append(f"subject= is required: a define_subject(...) value ({kind})")
    if key is _MISSING or key is None:
        faults.append("key= is required: a function of the input answering the person's key")
    elif not callable(key):
        faults.append("key must be a function of the input answering the person's key")


def _declare(
    kind: str,
    *,
    name: Any,
    input: Any,
    tenant: Any,
    subject: Subject,
    key: Callable[[Any], Any],
    faults: list[str],
    extra: Mapping[str, Any],
    body: Callable[[str], Callable[[JobContext[Any]], Any]],
) -> Job[Any, Any]:
    name_ok = isinstance(name, str) and bool(name.strip()) and len(name) <= MAX_NAME
    if name is _MISSING or name is None:
        faults.append(f"name= is required: the {kind} job's name")
    elif not name_ok:
        faults.append(f"name must be a non-empty string of at most {MAX_NAME} characters")
    job_name = name if name_ok else kind
    declare: Callable[[Callable[..., Any]], Job[Any, Any]] | None = None
    try:
        declare = job(
            name=job_name,
            input=input,
            tenant=tenant,
            idempotency_key=_idempotency(job_name, key),
            **extra,
        )
    except JobDeclarationError as exc:
        faults.extend(exc.meta.get("faults") or [exc.message])
    if faults or declare is None:
        raise JobDeclarationError(
            ErrorCode.X_JOB_DECLARATION_INVALID,
            f"{kind} declaration is invalid: " + "; ".join(faults),
            meta={"faults": faults},
        )
    handle = declare(body(job_name))
    handle.kind = kind
    handle.subject = subject  # type: ignore[attr-defined]
    return handle


def _idempotency(name: str, key: Callable[[Any], Any] | Any) -> Callable[[Any], str]:
    """One live run per person: the job's name and the person's key."""

    def idempotency_key(input: Any) -> str:
        value = key(input) if callable(key) else None
        return f"{name}:" + orjson.dumps(value, default=str).decode()

    return idempotency_key


def subject_erase(
    *,
    name: Any = _MISSING,
    input: Any = None,
    tenant: Any = "none",
    subject: Any = _MISSING,
    key: Any = _MISSING,
    queue: str = "default",
    retry: Retry | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
    **unknown: Any,
) -> Job[Any, dict[str, Any]]:
    """Declare the job that erases one person: ``kind == "subject-erase"``.

    ``key(input)`` answers the person's key (a tuple for a key of several
    columns). A run walks the catalog from ``subject``'s table and refuses,
    before its first write, anything ``trio-jobs verify`` would
    (``X_SUBJECT_TABLE_UNDECLARED``, ``X_SUBJECT_TREATMENT_INVALID``,
    ``X_SUBJECT_CYCLE``: terminal, nothing deleted). Then every operation of
    the plan runs a page of ``PAGE_ROWS`` rows per step, each page one
    ``step.transaction`` (its statement and its step record commit together):
    the keys closing a loop are cleared first, then tables are deleted or
    anonymized children first, the person's table last. A killed run resumes
    at the page it stopped on. PostgreSQL only (``X_NOT_IMPLEMENTED`` elsewhere).

    The result: ``{"rows": n, "pages": n, "tables": {table: {"treatment": ...,
    "rows": n}}}`` (a retained table's rows are 0: nothing was written).
    The idempotency key is the job's name and the person's key: one live
    erase per person.

    >>> erase_member = subject_erase(
    ...     name="members.erase",
    ...     input=EraseMember,
    ...     tenant=lambda i: str(i.org_id),
    ...     subject=members,
    ...     key=lambda i: (i.org_id, i.member_id),
    ... )
    """
    faults: list[str] = []
    _check_subject_fields("subject_erase", subject, key, faults, unknown)
    return _declare(
        "subject-erase",
        name=name,
        input=input,
        tenant=tenant,
        subject=subject,
        key=key,
        faults=faults,
        extra={"queue": queue, "retry": retry, "on_settled": on_settled},
        body=lambda job_name: _erase_body(job_name, subject, key),
    )


def _erase_body(name: str, subject: Subject, key: Callable[[Any], Any]) -> Any:
    async def run_subject_erase(ctx: JobContext[Any]) -> dict[str, Any]:
        await _postgres(ctx.jobs, "subject_erase")
        params = key_values(subject, await _call(key, ctx.input))
        async with ctx.jobs.transaction() as tx:
            plan = await planned(tx.execute, subject)
        tables: dict[str, dict[str, Any]] = {
            t: {"treatment": _treatment_name(tr), "rows": 0} for t, tr in plan.tables
        }
        rows = pages = 0
        for op in plan.operations:
            page = 1
            while True:

                async def one(tx: Any, op: Operation = op) -> int:
                    return await run_operation(tx.execute, op, params)

                n = int(await ctx.step.transaction(f"{op.label}:{page}", one))
                pages += 1
                if op.kind != "clear":
                    tables[op.table]["rows"] += n
                    rows += n
                if n < PAGE_ROWS:
                    break
                page += 1
        return {"rows": rows, "pages": pages, "tables": tables}

    run_subject_erase.__name__ = run_subject_erase.__qualname__ = name
    return run_subject_erase


def subject_export(
    *,
    name: Any = _MISSING,
    input: Any = None,
    tenant: Any = "none",
    subject: Any = _MISSING,
    key: Any = _MISSING,
    sink: Any = _MISSING,
    prefix: Any = _MISSING,
    format: Any = "ndjson",
    queue: str = "default",
    retry: Retry | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
    **unknown: Any,
) -> Job[Any, dict[str, Any]]:
    """Declare the job that exports one person's data: ``kind == "subject-export"``.

    The reach is the erase's (the same walk, the same refusals before anything
    is written). Every reached table is read a page of ``PAGE_ROWS`` rows per
    step and each page is one object ``<prefix>/<table>/part-NNNNN.ndjson``
    (one JSON object per row, as PostgreSQL's ``row_to_json`` writes it; a
    replay overwrites) or, with ``format="csv"``, ``part-NNNNN.csv`` (a header
    line naming the table's columns, each value as PostgreSQL's text, ``NULL``
    an empty cell, the export's formula guard on every cell), then
    ``<prefix>/index.json`` lists each table with its row count, treatment,
    ``retain`` reason and parts. ``sink(input)`` answers
    an obstore store; ``prefix`` is a string or a function of the input.
    PostgreSQL only. The result: ``{"tables": n, "rows": n, "index": path}``.

    >>> export_member = subject_export(
    ...     name="members.export",
    ...     input=ExportMember,
    ...     subject=members,
    ...     key=lambda i: i.member_id,
    ...     sink=lambda i: LocalStore("/srv/exports"),
    ...     prefix=lambda i: f"subjects/{i.member_id}",
    ... )
    """
    faults: list[str] = []
    _check_subject_fields("subject_export", subject, key, faults, unknown)
    if sink is _MISSING or sink is None:
        faults.append("sink= is required: a function of the input answering an obstore store")
    elif not callable(sink):
        faults.append("sink must be a function of the input answering an obstore store")
    if prefix is _MISSING or prefix is None:
        faults.append("prefix= is required: a string, or a function of the input answering one")
    elif not callable(prefix) and (_text_fault(prefix) or not isinstance(prefix, str)):
        faults.append("prefix must be a non-empty string or a function of the input")
    if format not in ("ndjson", "csv"):
        faults.append(
            "format must be 'ndjson' (one JSON object per row) or 'csv' (a header line "
            "and each column as PostgreSQL's text)"
        )
    return _declare(
        "subject-export",
        name=name,
        input=input,
        tenant=tenant,
        subject=subject,
        key=key,
        faults=faults,
        extra={"queue": queue, "retry": retry, "on_settled": on_settled},
        body=lambda job_name: _export_body(job_name, subject, key, sink, prefix, format),
    )


def _obstore() -> Any:
    try:
        import obstore
    except ImportError:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "subject_export writes with obstore: pip install 'trio-jobs[data]'",
        ) from None
    return obstore


async def _put(store: Any, path: str, data: bytes) -> None:
    """One object written; obstore's sync call in a thread (no asyncio on Trio)."""
    import trio

    ob = _obstore()
    await trio.to_thread.run_sync(ob.put, store, path, data)


def _page_sql(plan: Plan, table: str, fmt: str) -> tuple[str, tuple[str, ...]]:
    """One export page of ``table``'s reach after a position, and the columns
    a csv part names. A row's position is its ``ctid`` (its ``tableoid`` first
    in a partitioned table, where a ``ctid`` is a partition's)."""
    oid = plan.oids[table]
    columns = tuple(c.name for c in plan.columns.get(oid, ()))
    if fmt == "ndjson":
        values = "row_to_json(x)::text"
    else:
        values = ", ".join(f"x.{ident(c)}::text" for c in columns)
    if oid in plan.partitioned:
        position, after, order = (
            "x.tableoid::int8",
            "(x.tableoid, x.ctid) > (%(at)s::int8::oid, %(after)s::tid)",
            "x.tableoid, x.ctid",
        )
    else:
        position, after, order = "0::int8", "x.ctid > %(after)s::tid", "x.ctid"
    sql = (
        f"SELECT {position}, x.ctid::text, {values} FROM {plan.sql_names[oid]} x "
        f"WHERE {plan.reach[table]} AND {after} ORDER BY {order} LIMIT {PAGE_ROWS}"
    )
    return sql, columns


def _export_body(
    name: str, subject: Subject, key: Callable[[Any], Any], sink: Any, prefix: Any, fmt: str
) -> Any:
    async def run_subject_export(ctx: JobContext[Any]) -> dict[str, Any]:
        await _postgres(ctx.jobs, "subject_export")
        params = key_values(subject, await _call(key, ctx.input))
        async with ctx.jobs.transaction() as tx:
            plan = await planned(tx.execute, subject)
        base = prefix if isinstance(prefix, str) else await _call(prefix, ctx.input)
        if _text_fault(base) or not isinstance(base, str):
            raise JobsError(
                ErrorCode.X_JOB_DECLARATION_INVALID,
                f"subject_export {name!r}: prefix must answer a non-empty string",
            )
        base = base.rstrip("/")
        store = await _call(sink, ctx.input)
        _obstore()
        index: list[dict[str, Any]] = []
        total = 0
        for table, treatment in reversed(plan.tables):  # the person's table first
            sql, columns = _page_sql(plan, table, fmt)
            after: Any = [0, "(0,0)"]
            part, rows, parts = 0, 0, []
            while True:
                part += 1
                path = f"{base}/{table}/part-{part:05d}.{fmt}"

                async def page(
                    sql: str = sql, after: Any = after, path: str = path, columns: Any = columns
                ) -> Any:
                    async with ctx.jobs.transaction() as tx:
                        found = await tx.execute(sql, {**params, "at": after[0], "after": after[1]})
                    if not found:
                        return {"rows": 0, "after": None}
                    if fmt == "ndjson":
                        body = "".join(r[2] + "\n" for r in found).encode()
                    else:
                        body = render("csv", columns, [r[2:] for r in found], name)
                    await _put(store, path, body)
                    return {"rows": len(found), "after": [found[-1][0], found[-1][1]]}

                out = await ctx.step.run(f"export:{table}:{part}", page)
                if out["rows"]:
                    parts.append(path)
                    rows += int(out["rows"])
                if out["rows"] < PAGE_ROWS:
                    break
                # A page a run before this version recorded answered the ctid alone.
                after = out["after"] if isinstance(out["after"], list) else [0, out["after"]]
            total += rows
            entry: dict[str, Any] = {
                "table": table,
                "treatment": _treatment_name(treatment),
                "rows": rows,
                "parts": parts,
            }
            if isinstance(treatment, Retain):
                entry["reason"] = treatment.reason
            index.append(entry)
        index_path = f"{base}/index.json"
        listed = {"subject": subject.table, "format": fmt, "tables": index}

        async def write_index() -> str:
            await _put(store, index_path, orjson.dumps(listed, option=orjson.OPT_INDENT_2))
            return index_path

        await ctx.step.run("export:index", write_index)
        return {"tables": len(index), "rows": total, "index": index_path}

    run_subject_export.__name__ = run_subject_export.__qualname__ = name
    return run_subject_export


# ----------------------------------------------------------------------------- the proof

_TEXT_TYPES = ("text", "character varying", "character", "citext", "name")


class _RollBack(Exception):
    """Leaves the proof's transaction without committing what it seeded."""


def _seed_value(col: _Column, canary: str) -> tuple[str, Any] | None:
    """What a canary row puts in ``col`` that no foreign key fills: a canary in
    a text or JSON column, a neutral value in a not-null column without a
    default, nothing otherwise (its default, or ``NULL``)."""
    base = col.type.split("(")[0].strip()
    if base in _TEXT_TYPES:
        limit = col.type[len(base) :].strip("() ")
        if not limit or int(limit.split(",")[0]) >= len(canary):
            return "%s", canary
    if base in ("json", "jsonb"):
        return f"%s::{base}", orjson.dumps({"canary": canary}).decode()
    if not col.not_null or col.has_default:
        return None
    if base in ("smallint", "integer", "bigint"):
        return "(floor(random() * 1000000000))::" + base, None
    if base in ("numeric", "real", "double precision"):
        return f"0::{col.type}", None
    if base == "boolean":
        return "false", None
    if base == "uuid":
        return "gen_random_uuid()", None
    if base.startswith(("timestamp", "date", "time")):
        return f"now()::{col.type}", None
    if base == "bytea":
        return "''::bytea", None
    if base in _TEXT_TYPES:
        return f"left(%s, {limit.split(',')[0]})::{col.type}", canary  # too short for a canary
    raise JobsError(
        ErrorCode.X_NOT_IMPLEMENTED,
        f"subject_proof cannot seed {col.name} ({col.type}, not null, no default): "
        "give it a default, or prove this subject with rows of your own",
    )


async def subject_proof(jobs: Jobs, subject: Subject) -> None:
    """Prove ``subject`` erases what it should: seed a canary row in every
    reached table (a fresh marker in each text and JSON column), erase that
    generated person with the plan ``subject_erase`` runs, then search every
    text and JSON column of every table in the reached tables' schemas for
    the marker. One found outside a retained table is
    ``X_SUBJECT_ERASE_INCOMPLETE`` naming the table and the column (each one
    found is in ``meta["found"]``). Runs in one transaction that is rolled
    back: nothing seeded stays (a list- or range-partitioned table without a
    default partition gets one for the canaries, inside that transaction: it
    holds the table's lock until the proof ends). PostgreSQL only; refuses
    what ``trio-jobs verify`` refuses first.

    >>> await subject_proof(jobs, members)  # raises when a column keeps the person
    """
    if not isinstance(subject, Subject):
        raise JobsError(
            ErrorCode.X_JOB_DECLARATION_INVALID,
            "subject_proof takes a define_subject(...) value",
        )
    await _postgres(jobs, "subject_proof")
    found: list[tuple[str, str]] = []
    try:
        async with jobs.transaction() as tx:
            plan = await planned(tx.execute, subject)
            [(token,)] = await tx.execute("SELECT left(md5(gen_random_uuid()::text), 10)", {})
            canary = f"cn{token}"
            await _default_partitions(tx.execute, plan)
            key = await _seed(tx.execute, plan, canary)
            for op in plan.operations:
                while await run_operation(tx.execute, op, key) >= PAGE_ROWS:
                    pass
            kept = {plan.oids[t] for t, tr in plan.tables if isinstance(tr, Retain)}
            rows = await tx.execute(
                "SELECT c.oid::int8, c.oid::regclass::text, a.attname::text "
                "FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid "
                "WHERE c.relnamespace IN (SELECT relnamespace FROM pg_class "
                "WHERE oid = ANY(%(oids)s::oid[])) AND c.relkind IN ('r', 'p') "
                # a partition's rows are its parent's (searched, and kept, there)
                "AND NOT c.relispartition "
                "AND c.relname NOT LIKE 'trio\\_jobs\\_%%' AND a.attnum > 0 "
                "AND NOT a.attisdropped AND (a.atttypid IN ('text'::regtype, "
                "'varchar'::regtype, 'bpchar'::regtype, 'json'::regtype, 'jsonb'::regtype) "
                "OR format_type(a.atttypid, NULL) = 'citext') ORDER BY 2, 3",
                {"oids": sorted(plan.oids.values())},
            )
            for oid, table, column in rows:
                if int(oid) in kept:
                    continue
                [(hit,)] = await tx.execute(
                    f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {ident(column)}::text "
                    "LIKE %(canary)s)",
                    {"canary": f"%{canary}%"},
                )
                if hit:
                    found.append((table, column))
            raise _RollBack
    except _RollBack:
        pass
    if found:
        raise JobsError(
            ErrorCode.X_SUBJECT_ERASE_INCOMPLETE,
            f"the subject {subject.table!r} leaves the person in "
            + ", ".join(f"{t}.{c}" for t, c in found)
            + ": delete that table, Anonymize that column, or Retain the table with a reason "
            "(a table the catalog cannot link to the person: columns=)",
            meta={"found": [{"table": t, "column": c} for t, c in found]},
        )


async def _default_partitions(execute: Execute, plan: Plan) -> None:
    """Give each reached list- or range-partitioned table without a default
    partition one (in the proof's rolled-back transaction: it never stays), so
    a canary row whose generated key no partition holds has a place."""
    if not plan.partitioned:
        return
    rows = await execute(
        "SELECT n.nspname::text, c.relname::text, c.oid::regclass::text FROM pg_partitioned_table p "
        "JOIN pg_class c ON c.oid = p.partrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE p.partrelid = ANY(%(oids)s::oid[]) AND p.partstrat IN ('l', 'r') "
        "AND p.partdefid = 0 ORDER BY 3",
        {"oids": sorted(plan.partitioned)},
    )
    for schema, name, table in rows:
        await execute(
            f"CREATE TABLE {ident(schema)}.{ident(name[:40] + '_trio_jobs_proof')} "
            f"PARTITION OF {table} DEFAULT",
            {},
        )


async def _seed(execute: Execute, plan: Plan, canary: str) -> dict[str, Any]:
    """Insert one canary row per reached table, parents first; answer the
    generated person's key as the plan's parameters."""
    into: dict[int, list[_Edge]] = {}
    for e in plan.edges:
        into.setdefault(e.child, []).append(e)
    made: dict[int, dict[str, str | None]] = {}
    root = plan.oids[plan.subject.table] if plan.subject.table in plan.oids else None
    key: dict[str, Any] = {}
    for table, _treatment in reversed(plan.tables):
        oid = plan.oids[table]
        cols = {c.name: c for c in plan.columns.get(oid, ())}
        chosen: dict[str, tuple[str, Any]] = {}
        for e in into.get(oid, []):
            parent = made.get(e.parent)
            if parent is None:
                continue
            for c, p in zip(e.child_cols, e.parent_cols, strict=True):
                chosen.setdefault(c, (f"%s::{cols[c].type}", parent[p]))
        for n, col in enumerate(cols.values()):
            if col.name in chosen:
                continue
            value = _seed_value(col, f"{canary}{n:02d}")
            if value is not None:
                chosen[col.name] = value
        names = list(chosen)
        sql = (
            f"INSERT INTO {plan.sql_names[oid]} ({', '.join(ident(c) for c in names)}) "
            f"VALUES ({', '.join(chosen[c][0].replace('%s', f'%(v{i})s') for i, c in enumerate(names))}) "
            f"RETURNING {', '.join(f'{ident(c)}::text' for c in cols)}"
        )
        if not names:
            sql = f"INSERT INTO {plan.sql_names[oid]} DEFAULT VALUES RETURNING " + ", ".join(
                f"{ident(c)}::text" for c in cols
            )
        [row] = await execute(sql, {f"v{i}": chosen[c][1] for i, c in enumerate(names)})
        made[oid] = dict(zip(cols, row, strict=True))
        if oid == root:
            for i, k in enumerate(plan.subject.key):
                key[f"k{i}"] = made[oid][k]
    return key
