/**
 * Look-alikes of pg_catalog's functions and operators, planted by a role
 * that can create objects in a schema on the app's search_path: what a
 * statement that names a function or operator without its schema may run
 * instead of the real one, as the app's role. Each plant counts its calls in
 * a sequence (not transactional: a call in a statement that was then rolled
 * back still counts), says which plant it is in a NOTICE, and then does what
 * the original does, so everything keeps working and every plant reached is
 * seen, not only the first.
 *
 * Made from the catalog, so nothing outlive's SQL calls is left out by hand:
 * - a copy of every pg_catalog function a PL/pgSQL function can copy, and of
 *   every pg_catalog operator, with the same argument types: they win over
 *   the real ones when a session's path lists their schema before pg_catalog;
 * - for every operator name, an operator of exactly the two types a
 *   statement may give it (outlive's enums, the types of its columns and
 *   parameters, and their arrays) wherever pg_catalog's operator takes other
 *   types (anyenum, anyelement, a type reached by an implicit cast): an exact
 *   match beats pg_catalog's even when pg_catalog is searched first;
 * - the same for every function of one or two arguments that takes a
 *   polymorphic type or "any", and for the aggregates (count(*) and
 *   jsonb_object_agg by hand, the one-argument ones from the catalog);
 * - concrete overloads of the VARIADIC "any" functions (jsonb_build_array,
 *   jsonb_build_object, ...) for the argument lists outlive's SQL gives them.
 */

/** The types given to polymorphic and "any" arguments, as `format_type` spells them. */
const SCALARS = [
  'text', 'integer', 'bigint', 'double precision', 'numeric', 'jsonb', 'timestamp with time zone', 'interval',
  'boolean', 'xid', 'outlive.task_state', 'outlive.run_state',
];
const ARRAYS = ['text', 'integer', 'bigint', 'double precision', 'jsonb', 'timestamp with time zone', 'outlive.task_state', 'outlive.run_state'].map((t) => `${t}[]`);

const literal = (s: string) => `'${s.replace(/'/g, "''")}'`;
const array = (items: string[]) => `ARRAY[${items.map(literal).join(', ')}]::text[]`;

/**
 * SQL that plants the look-alikes in `schema` (a plain name, created and
 * owned by the role running it), with the counter `schema.hits`. Run it as
 * the planting role.
 */
export function plantsSql(schema: string): string {
  const s = `"${schema.replace(/"/g, '""')}"`;
  return `
CREATE SEQUENCE ${s}.hits;
GRANT USAGE, SELECT ON SEQUENCE ${s}.hits TO PUBLIC;
CREATE FUNCTION ${s}.hit(what text) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
  PERFORM pg_catalog.nextval(${literal(`${s}.hits`)}::pg_catalog.regclass);
  RAISE NOTICE 'outlive-plant: %', what;
END $f$;

-- A function named fname taking argtypes (the last VARIADIC if variadic),
-- returning rettype (a set if retset): counts, then calls pg_catalog's.
CREATE FUNCTION ${s}._plant_function(fname text, argtypes text[], is_variadic boolean, rettype text, retset boolean) RETURNS void
LANGUAGE plpgsql AS $f$
DECLARE
  n int := coalesce(pg_catalog.array_length(argtypes, 1), 0);
  decl text := '';
  call text := '';
  body text;
  sig text;
BEGIN
  FOR i IN 1..n LOOP
    decl := decl || CASE WHEN i > 1 THEN ', ' ELSE '' END || CASE WHEN is_variadic AND i = n THEN 'VARIADIC ' ELSE '' END || argtypes[i];
    call := call || CASE WHEN i > 1 THEN ', ' ELSE '' END || CASE WHEN is_variadic AND i = n THEN 'VARIADIC ' ELSE '' END || '$' || i;
  END LOOP;
  sig := pg_catalog.format('%I(%s)', fname, decl);
  body := CASE
    WHEN rettype = 'void' THEN pg_catalog.format('PERFORM pg_catalog.%I(%s);', fname, call)
    WHEN retset THEN pg_catalog.format('RETURN QUERY SELECT * FROM pg_catalog.%I(%s);', fname, call)
    ELSE pg_catalog.format('RETURN pg_catalog.%I(%s);', fname, call) END;
  EXECUTE pg_catalog.format(
    'CREATE FUNCTION %s.%s RETURNS %s%s LANGUAGE plpgsql AS %L',
    ${literal(s)}, sig, CASE WHEN retset THEN 'SETOF ' ELSE '' END, rettype,
    pg_catalog.format('BEGIN PERFORM %s.hit(%L); %s END', ${literal(s)}, 'function ' || sig, body));
END $f$;

-- An operator oname on (ltype, rtype), ltype null for a prefix operator:
-- counts, then applies pg_catalog's.
CREATE FUNCTION ${s}._plant_operator(oname text, ltype text, rtype text, rettype text) RETURNS void
LANGUAGE plpgsql AS $f$
DECLARE
  fname text := '_op_' || pg_catalog.md5(pg_catalog.concat_ws(',', oname, ltype, rtype));
  sig text := pg_catalog.format('%s(%s)', oname, pg_catalog.concat_ws(', ', coalesce(ltype, 'NONE'), rtype));
BEGIN
  EXECUTE pg_catalog.format(
    'CREATE FUNCTION %s.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
    ${literal(s)}, fname, pg_catalog.concat_ws(', ', ltype, rtype), rettype,
    pg_catalog.format('BEGIN PERFORM %s.hit(%L); RETURN %s OPERATOR(pg_catalog.%s) %s; END',
      ${literal(s)}, 'operator ' || sig, CASE WHEN ltype IS NULL THEN '' ELSE '$1' END, oname, CASE WHEN ltype IS NULL THEN '$1' ELSE '$2' END));
  EXECUTE pg_catalog.format('CREATE OPERATOR %s.%s (%s RIGHTARG = %s, FUNCTION = %s.%I)',
    ${literal(s)}, oname, CASE WHEN ltype IS NULL THEN '' ELSE 'LEFTARG = ' || ltype || ',' END, rtype, ${literal(s)}, fname);
END $f$;

-- The type an expression has, or null when Postgres cannot resolve it.
CREATE FUNCTION ${s}._type_of(expr text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
  t text;
BEGIN
  EXECUTE 'SELECT pg_catalog.pg_typeof((' || expr || '))::text' INTO t;
  RETURN t;
EXCEPTION WHEN OTHERS THEN
  RETURN NULL;
END $f$;

CREATE FUNCTION ${s}._collect(state anyarray, x anyelement) RETURNS anyarray LANGUAGE plpgsql AS $f$
BEGIN
  PERFORM ${s}.hit('an aggregate''s row');
  RETURN pg_catalog.array_append(state, x);
END $f$;

CREATE FUNCTION ${s}._count_star(n bigint) RETURNS bigint LANGUAGE plpgsql AS $f$
BEGIN
  PERFORM ${s}.hit('aggregate count(*)');
  RETURN n OPERATOR(pg_catalog.+) 1;
END $f$;
CREATE AGGREGATE ${s}.count(*) (SFUNC = ${s}._count_star, STYPE = bigint, INITCOND = '0');

CREATE FUNCTION ${s}._object_add(state jsonb, k text, v anyelement) RETURNS jsonb LANGUAGE plpgsql AS $f$
BEGIN
  PERFORM ${s}.hit('aggregate jsonb_object_agg');
  RETURN coalesce(state, '{}') OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object(k, v);
END $f$;

DO $plant$
DECLARE
  scalars text[] := ${array(SCALARS)};
  every text[] := ${array([...SCALARS, ...ARRAYS])};
  arrays text[] := ${array(ARRAYS)};
  enums text[] := ARRAY['outlive.task_state', 'outlive.run_state'];
  f record;
  op text;
  l text;
  r text;
  t text;
  rt text;
  c1 text[];
  c2 text[];
  made text[] := '{}';
  sig text;
BEGIN
  -- Copies of pg_catalog's functions and operators, same argument types.
  FOR f IN
    SELECT p.proname, p.provariadic <> 0 AS is_variadic, p.proretset, pg_catalog.format_type(p.prorettype, NULL) AS rettype,
           ARRAY(SELECT pg_catalog.format_type(a, NULL) FROM pg_catalog.unnest(p.proargtypes::oid[]) WITH ORDINALITY AS x(a, i) ORDER BY i) AS argtypes
    FROM pg_catalog.pg_proc p
    WHERE p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace AND p.prokind = 'f' AND p.proallargtypes IS NULL
  LOOP
    BEGIN
      PERFORM ${s}._plant_function(f.proname, f.argtypes, f.is_variadic, f.rettype, f.proretset);
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
  END LOOP;
  FOR f IN
    SELECT o.oprname, CASE WHEN o.oprleft = 0 THEN NULL ELSE pg_catalog.format_type(o.oprleft, NULL) END AS l,
           pg_catalog.format_type(o.oprright, NULL) AS r, pg_catalog.format_type(o.oprresult, NULL) AS rettype
    FROM pg_catalog.pg_operator o WHERE o.oprnamespace = 'pg_catalog'::pg_catalog.regnamespace
  LOOP
    BEGIN
      PERFORM ${s}._plant_operator(f.oprname, f.l, f.r, f.rettype);
      made := made || (f.oprname || '(' || coalesce(f.l, 'NONE') || ',' || f.r || ')');
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
  END LOOP;

  -- Operators of exactly the types a statement gives them, where
  -- pg_catalog's operator takes others.
  FOR op IN SELECT DISTINCT o.oprname FROM pg_catalog.pg_operator o WHERE o.oprnamespace = 'pg_catalog'::pg_catalog.regnamespace LOOP
    FOREACH r IN ARRAY every LOOP
      FOREACH l IN ARRAY (NULL::text || every) LOOP
        sig := op || '(' || coalesce(l, 'NONE') || ',' || r || ')';
        CONTINUE WHEN sig OPERATOR(pg_catalog.=) ANY (made);
        rt := ${s}._type_of(pg_catalog.format('%s OPERATOR(pg_catalog.%s) NULL::%s', CASE WHEN l IS NULL THEN '' ELSE 'NULL::' || l END, op, r));
        CONTINUE WHEN rt IS NULL;
        BEGIN
          PERFORM ${s}._plant_operator(op, l, r, rt);
          made := made || sig;
        EXCEPTION WHEN OTHERS THEN NULL;
        END;
      END LOOP;
    END LOOP;
  END LOOP;

  -- Functions of one or two arguments taking a polymorphic type or "any",
  -- instantiated at the types a statement gives them.
  made := '{}';
  FOR f IN
    SELECT p.proname, p.proretset,
           ARRAY(SELECT pg_catalog.format_type(a, NULL) FROM pg_catalog.unnest(p.proargtypes::oid[]) WITH ORDINALITY AS x(a, i) ORDER BY i) AS argtypes
    FROM pg_catalog.pg_proc p
    WHERE p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace AND p.prokind = 'f' AND p.proallargtypes IS NULL
      AND p.pronargs BETWEEN 1 AND 2 AND p.provariadic = 0
      AND EXISTS (SELECT 1 FROM pg_catalog.unnest(p.proargtypes::oid[]) a JOIN pg_catalog.pg_type y ON y.oid OPERATOR(pg_catalog.=) a
                  WHERE y.typtype OPERATOR(pg_catalog.=) 'p')
  LOOP
    c1 := CASE f.argtypes[1] WHEN 'anyarray' THEN arrays WHEN 'anycompatiblearray' THEN arrays WHEN 'anyenum' THEN enums
            WHEN 'anynonarray' THEN scalars WHEN 'anycompatiblenonarray' THEN scalars
            WHEN 'anyelement' THEN every WHEN 'anycompatible' THEN every WHEN '"any"' THEN every ELSE ARRAY[f.argtypes[1]] END;
    c2 := CASE WHEN pg_catalog.array_length(f.argtypes, 1) OPERATOR(pg_catalog.<) 2 THEN ARRAY[NULL::text]
            ELSE CASE f.argtypes[2] WHEN 'anyarray' THEN arrays WHEN 'anycompatiblearray' THEN arrays WHEN 'anyenum' THEN enums
            WHEN 'anynonarray' THEN scalars WHEN 'anycompatiblenonarray' THEN scalars
            WHEN 'anyelement' THEN every WHEN 'anycompatible' THEN every WHEN '"any"' THEN every ELSE ARRAY[f.argtypes[2]] END END;
    FOREACH l IN ARRAY c1 LOOP
      FOREACH r IN ARRAY c2 LOOP
        sig := f.proname || '(' || pg_catalog.concat_ws(',', l, r) || ')';
        CONTINUE WHEN sig OPERATOR(pg_catalog.=) ANY (made);
        CONTINUE WHEN pg_catalog.to_regprocedure(pg_catalog.format('pg_catalog.%I(%s)', f.proname, pg_catalog.concat_ws(',', l, r))) IS NOT NULL;
        rt := ${s}._type_of(pg_catalog.format('SELECT x FROM pg_catalog.%I(%s) AS x LIMIT 0', f.proname,
                pg_catalog.concat_ws(', ', 'NULL::' || l, 'NULL::' || r)));
        CONTINUE WHEN rt IS NULL OR rt OPERATOR(pg_catalog.=) 'record';
        BEGIN
          PERFORM ${s}._plant_function(f.proname, CASE WHEN r IS NULL THEN ARRAY[l] ELSE ARRAY[l, r] END, false, rt, f.proretset);
          made := made || sig;
        EXCEPTION WHEN OTHERS THEN NULL;
        END;
      END LOOP;
    END LOOP;
  END LOOP;

  -- The VARIADIC "any" functions, at the argument lists outlive's SQL gives them.
  FOR f IN
    SELECT DISTINCT p.proname FROM pg_catalog.pg_proc p
    WHERE p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace AND p.provariadic OPERATOR(pg_catalog.=) '"any"'::pg_catalog.regtype
  LOOP
    FOREACH t IN ARRAY every LOOP
      FOREACH c1 SLICE 1 IN ARRAY ARRAY[ARRAY[t, NULL], ARRAY['text', t]] LOOP
        c1 := pg_catalog.array_remove(c1, NULL);
        rt := ${s}._type_of(pg_catalog.format('pg_catalog.%I(%s)', f.proname,
                (SELECT pg_catalog.string_agg('NULL::' || a, ', ') FROM pg_catalog.unnest(c1) a)));
        CONTINUE WHEN rt IS NULL;
        BEGIN
          PERFORM ${s}._plant_function(f.proname, c1, false, rt, false);
        EXCEPTION WHEN OTHERS THEN NULL;
        END;
      END LOOP;
    END LOOP;
  END LOOP;
  BEGIN
    PERFORM ${s}._plant_function('jsonb_build_object',
      ARRAY['text', 'integer', 'text', 'timestamp with time zone', 'text', 'text', 'text', 'text'], false, 'jsonb', false);
  EXCEPTION WHEN OTHERS THEN NULL;
  END;

  -- Aggregates of one argument, at every scalar type they take; and
  -- jsonb_object_agg of a text key.
  FOR f IN SELECT DISTINCT p.proname FROM pg_catalog.pg_proc p
           WHERE p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace AND p.prokind = 'a' AND p.pronargs = 1 LOOP
    FOREACH t IN ARRAY scalars LOOP
      rt := ${s}._type_of(pg_catalog.format('SELECT pg_catalog.%I(x) FROM (SELECT NULL::%s AS x) v LIMIT 0', f.proname, t));
      CONTINUE WHEN rt IS NULL;
      BEGIN
        sig := '_final_' || pg_catalog.md5(f.proname || '(' || t || ')');
        EXECUTE pg_catalog.format('CREATE FUNCTION %s.%I(state %s[]) RETURNS %s LANGUAGE plpgsql AS %L', ${literal(s)}, sig, t, rt,
          pg_catalog.format('BEGIN PERFORM %s.hit(%L); RETURN (SELECT pg_catalog.%I(x) FROM pg_catalog.unnest(state) AS x); END',
            ${literal(s)}, 'aggregate ' || f.proname || '(' || t || ')', f.proname));
        EXECUTE pg_catalog.format('CREATE AGGREGATE %s.%I(%s) (SFUNC = %s._collect, STYPE = %s[], FINALFUNC = %s.%I, INITCOND = ''{}'')',
          ${literal(s)}, f.proname, t, ${literal(s)}, t, ${literal(s)}, sig);
      EXCEPTION WHEN OTHERS THEN NULL;
      END;
    END LOOP;
  END LOOP;
  FOREACH t IN ARRAY scalars LOOP
    BEGIN
      EXECUTE pg_catalog.format('CREATE AGGREGATE %s.jsonb_object_agg(text, %s) (SFUNC = %s._object_add, STYPE = jsonb)', ${literal(s)}, t, ${literal(s)});
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
  END LOOP;
END $plant$;
`;
}

/** Plants made, by kind, as the catalog lists them in `schema`. */
export const COUNT_PLANTS_SQL = `
SELECT (SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) n.oid AND p.prokind OPERATOR(pg_catalog.=) 'f'
          AND p.proname OPERATOR(pg_catalog.!~) '^(_|hit$)')::int AS functions,
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) n.oid AND p.prokind OPERATOR(pg_catalog.=) 'a')::int AS aggregates,
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_operator o WHERE o.oprnamespace OPERATOR(pg_catalog.=) n.oid)::int AS operators
FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) $1`;
