-- Demo data for the example schemas, written the way the application writes (docs/design.md §2): each
-- entity row, its EAV rows and one dirty change_log slot whose changed_at equals the row's
-- ltbase_updated_at. :customer / :order are the registered schema ids; :customers / :orders
-- the row counts.
\set ON_ERROR_STOP on
SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms \gset

INSERT INTO entity_main (ltbase_schema_id, ltbase_row_id, ltbase_created_at, ltbase_updated_at,
  ltbase_created_by, text_01, text_02, smallint_01, integer_01, double_01, uuid_01, bigint_01,
  text_03, smallint_02, text_04, text_05)
SELECT :customer, gen_random_uuid(), :now_ms, :now_ms, 'demo',
  (ARRAY['Ada', 'Grace', 'Alan', 'Edsger', 'Barbara', 'Donald', 'Frances', 'Ken'])[1 + i % 8] || ' ' || i,
  'customer' || i || '@example.com',
  (18 + i % 70)::smallint, (i * 37) % 10000, round((i % 5000) * 1.25, 2), gen_random_uuid(),
  -- birth date (unix ms) and sign-up time (ISO 8601 text)
  (EXTRACT(epoch FROM DATE '1950-01-01' + (i % 20000)) * 1000)::bigint,
  to_char(TIMESTAMP '2020-01-01' + (i % 1500) * INTERVAL '1 day' + (i % 86400) * INTERVAL '1 second',
          'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
  (i % 3 <> 0)::int::smallint, CASE WHEN i % 2 = 0 THEN '1' ELSE '0' END,
  (ARRAY['Berlin', 'Lisbon', 'Osaka', 'Quito', 'Nairobi', 'Oslo'])[1 + i % 6]
FROM generate_series(1, :customers) AS i;

INSERT INTO eav_data (schema_id, row_id, attr_id, array_indices, value_text, value_numeric)
SELECT :customer, ltbase_row_id, a.attr_id, a.idx, a.txt, a.num
FROM (SELECT ltbase_row_id, row_number() OVER (ORDER BY ltbase_row_id) AS i
      FROM entity_main WHERE ltbase_schema_id = :customer) c
CROSS JOIN LATERAL (VALUES
  (11::smallint, '', NULL, (c.i * 1000 % 50000)::float8),
  (12, '', NULL, (1 + c.i % 5)::float8),
  (13, '', NULL, (c.i % 400)::float8),
  (14, '', NULL, round(((c.i % 10000) - 2500) / 4.0, 2)::float8),
  (15, '', NULL, (:now_ms - (c.i % 90) * 86400000)::float8),
  (17, '', NULL, (c.i % 10 = 0)::int::float8),
  (20, '', '+1 555 ' || lpad((c.i % 10000)::text, 4, '0'), NULL),
  -- tags: a list of 0..2 elements; i % 7 = 0 stores the explicit empty-list marker
  (19, CASE WHEN c.i % 7 = 0 THEN '' ELSE '0' END, CASE WHEN c.i % 7 = 0 THEN NULL ELSE 'tag-' || c.i % 5 END, NULL),
  (19, '1', 'tag-' || c.i % 11, NULL)
) AS a(attr_id, idx, txt, num)
WHERE NOT (a.attr_id = 19 AND a.idx = '1' AND c.i % 7 IN (0, 1));

INSERT INTO entity_main (ltbase_schema_id, ltbase_row_id, ltbase_created_at, ltbase_updated_at,
  ltbase_created_by, text_01, uuid_01, bigint_01, double_01, integer_01, text_02)
SELECT :order, gen_random_uuid(), :now_ms, :now_ms, 'demo',
  'ORD-' || lpad(i::text, 7, '0'), gen_random_uuid(), :now_ms - (i % 1000)::bigint * 3600000,
  round((i % 900) * 3.7 + 9.99, 2), 1 + i % 6,
  to_char(DATE '2026-12-01' + (i % 30), 'YYYY-MM-DD')
FROM generate_series(1, :orders) AS i;

INSERT INTO eav_data (schema_id, row_id, attr_id, array_indices, value_text, value_numeric)
SELECT :order, ltbase_row_id, a.attr_id, a.idx, a.txt, a.num
FROM (SELECT ltbase_row_id, row_number() OVER (ORDER BY ltbase_row_id) AS i
      FROM entity_main WHERE ltbase_schema_id = :order) o
CROSS JOIN LATERAL (VALUES
  (6::smallint, '', (ARRAY['new', 'paid', 'shipped', 'cancelled'])[1 + o.i % 4], NULL::float8),
  (7, '', NULL, (1 + o.i % 3)::float8),
  (8, '0', 'SKU-' || o.i % 300, NULL),
  (8, '1', 'SKU-' || (o.i * 7) % 300, NULL),
  (9, '0', NULL, (1 + o.i % 4)::float8),
  (9, '1', NULL, (1 + o.i % 2)::float8),
  (10, '', NULL, NULL),
  (11, '', NULL, (o.i % 4 = 0)::int::float8)
) AS a(attr_id, idx, txt, num);

INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at)
SELECT ltbase_schema_id, ltbase_row_id, 0, ltbase_updated_at FROM entity_main
WHERE ltbase_schema_id IN (:customer, :order)
ON CONFLICT (schema_id, row_id, flushed_at) DO UPDATE SET changed_at = EXCLUDED.changed_at, deleted_at = NULL;
ANALYZE;
