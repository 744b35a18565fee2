-- A burst of application writes, following the writer contract: updates
-- (GREATEST(now, prev + 1)), hard deletes (a tombstone slot at max(now, prev + 1), entity and
-- EAV rows removed) and recreates of deleted ids (above every version ever recorded).
\set ON_ERROR_STOP on
SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms \gset

-- 3% of customers change name and loyalty points.
WITH upd AS (
  UPDATE entity_main SET text_01 = text_01 || ' (moved)', integer_01 = integer_01 + 100,
         ltbase_updated_at = GREATEST(:now_ms, ltbase_updated_at + 1), ltbase_updated_by = 'demo'
  WHERE ltbase_schema_id = :customer AND ltbase_row_id IN (
    SELECT ltbase_row_id FROM entity_main WHERE ltbase_schema_id = :customer
    ORDER BY md5(ltbase_row_id::text) LIMIT (:customers * 3 / 100))
  RETURNING ltbase_row_id, ltbase_updated_at)
INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at, deleted_at)
SELECT :customer, ltbase_row_id, 0, ltbase_updated_at, NULL FROM upd
ON CONFLICT (schema_id, row_id, flushed_at) DO UPDATE SET changed_at = EXCLUDED.changed_at, deleted_at = EXCLUDED.deleted_at;

-- 2% of orders are deleted.
CREATE TEMP TABLE gone AS
  SELECT ltbase_row_id AS row_id, GREATEST(:now_ms, ltbase_updated_at + 1) AS stamp
  FROM entity_main WHERE ltbase_schema_id = :order
  ORDER BY md5(ltbase_row_id::text) LIMIT (:orders * 2 / 100);
DELETE FROM eav_data e USING gone g WHERE e.schema_id = :order AND e.row_id = g.row_id;
DELETE FROM entity_main m USING gone g WHERE m.ltbase_schema_id = :order AND m.ltbase_row_id = g.row_id;
INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at, deleted_at)
SELECT :order, row_id, 0, stamp, stamp FROM gone
ON CONFLICT (schema_id, row_id, flushed_at) DO UPDATE SET changed_at = EXCLUDED.changed_at, deleted_at = EXCLUDED.deleted_at;

-- A tenth of them come back (same row id, new version above the tombstone).
WITH back AS (
  SELECT g.row_id, GREATEST(:now_ms, (SELECT max(changed_at) FROM change_log c
                                      WHERE c.schema_id = :order AND c.row_id = g.row_id) + 1) AS v
  FROM gone g ORDER BY g.row_id LIMIT (:orders * 2 / 1000)),
ins AS (
  INSERT INTO entity_main (ltbase_schema_id, ltbase_row_id, ltbase_created_at, ltbase_updated_at,
    ltbase_created_by, text_01, double_01, integer_01)
  SELECT :order, row_id, :now_ms, v, 'demo', 'ORD-REOPENED', 42.0, 1 FROM back
  RETURNING ltbase_row_id, ltbase_updated_at)
INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at, deleted_at)
SELECT :order, ltbase_row_id, 0, ltbase_updated_at, NULL FROM ins
ON CONFLICT (schema_id, row_id, flushed_at) DO UPDATE SET changed_at = EXCLUDED.changed_at, deleted_at = EXCLUDED.deleted_at;
