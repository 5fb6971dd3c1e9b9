-- rollup() and refresh_view() (_rollup.py): what the catalog says about the
-- app's relation, read inside the run's own transaction before its first write.
-- A name is resolved as PostgreSQL resolves it in a statement (the search path,
-- or a schema-qualified name); every answer names it as regclass prints it.

-- name: rollup_relation
-- The relation a name resolves to: its kind ('r' table, 'p' partitioned table,
-- 'v' view, 'm' materialized view, ...), its name as a statement must spell it,
-- and its columns in order (dropped and system columns left out). No row: no
-- such relation.
SELECT c.relkind::text,
       c.oid::regclass::text,
       coalesce(
           (SELECT array_agg(a.attname::text ORDER BY a.attnum)
            FROM pg_attribute a
            WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
           ARRAY[]::text[]
       )
FROM pg_class c
WHERE c.oid = to_regclass(%(name)s);

-- name: rollup_unique_keys
-- The column sets of the relation's unique indexes that an upsert (ON CONFLICT
-- on columns) or REFRESH ... CONCURRENTLY can use: plain columns only (no
-- expression), no WHERE, checked at once (not deferrable), valid.
SELECT array_agg(a.attname::text ORDER BY k.ord)
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = to_regclass(%(name)s)
  AND i.indisunique AND i.indimmediate AND i.indisvalid
  AND i.indpred IS NULL AND i.indexprs IS NULL
  AND k.ord <= i.indnkeyatts
GROUP BY i.indexrelid;
