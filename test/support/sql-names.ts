/**
 * A reading of the SQL in outlive's sources for names Postgres would look up
 * on the session's search_path: a function called without its schema, an
 * operator written bare, and the constructs that pick an operator by name
 * (IN, BETWEEN, NULLIF, IS DISTINCT FROM, LIKE, CASE x WHEN). The rule it
 * checks is ARCHITECTURE.md's "Names in SQL". It reads every string and
 * template literal that looks like SQL, with `${...}` read as one name (the
 * fragments interpolated are literals of their own, read too).
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import ts from 'typescript';

/** A name Postgres would look for on the path, where it was found. */
export interface Finding {
  where: string;
  what: string;
}

// Words that may stand before `(` without being a function call: SQL's own
// constructs (coalesce, greatest, least, EXISTS, ANY, ARRAY(...), EXTRACT,
// which Postgres turns into pg_catalog.extract, WITHIN GROUP (ORDER BY ...))
// and clause keywords.
const NOT_CALLS = new Set([
  'coalesce', 'greatest', 'least', 'exists', 'any', 'all', 'array', 'extract', 'values', 'filter', 'over', 'from', 'where',
  'and', 'or', 'not', 'on', 'select', 'join', 'lateral', 'conflict', 'when', 'then', 'else', 'as', 'using', 'by', 'into', 'returning',
  'set', 'with', 'union', 'recursive', 'limit', 'is', 'null', 'distinct', 'end', 'case', 'offset', 'rows', 'group',
]);
// Constructs that resolve an operator through the path, and cannot name one.
const BANNED = new Set(['in', 'between', 'nullif', 'like', 'ilike', 'similar']);
const CLAUSE_ENDS = new Set(['from', 'where', 'returning', 'on']);

type Token = { kind: 'word' | 'op' | 'punct' | 'other'; text: string };

function tokens(sql: string): Token[] {
  const out: Token[] = [];
  const re = /\s+|--[^\n]*|'(?:[^']|'')*'|"(?:[^"]|"")*"|\$\d+|::|[A-Za-z_][\w$]*(?:\s*\.\s*(?:[A-Za-z_][\w$]*|\*))*|\d+(?:\.\d+)?|[+\-*/<>=~!@#%^&|`?]+|[()[\],;.]|[^]/gy;
  let m: RegExpExecArray | null;
  while (re.lastIndex < sql.length && (m = re.exec(sql))) {
    const t = m[0];
    if (/^\s/.test(t) || t.startsWith('--')) continue;
    if (t.startsWith("'")) out.push({ kind: 'other', text: "''" });
    else if (t.startsWith('"')) out.push({ kind: 'word', text: 'x' });
    else if (/^[A-Za-z_]/.test(t)) out.push({ kind: 'word', text: t.replace(/\s+/g, '') });
    else if (/^[+\-*/<>=~!@#%^&|`?]+$/.test(t)) out.push({ kind: 'op', text: t });
    else if (/^[()[\],;.]$/.test(t) || t === '::') out.push({ kind: 'punct', text: t });
    else out.push({ kind: 'other', text: t });
  }
  return out;
}

/** What in one SQL text Postgres would look up on the path. */
export function unqualifiedNames(sql: string): string[] {
  const found: string[] = [];
  const t = tokens(sql);
  const lower = (i: number) => t[i]?.text.toLowerCase();
  let depth = 0;
  // The SET lists of UPDATE and DO UPDATE: where `col =` assigns.
  let setDepth: number | null = null;
  let expectTarget = false;
  for (let i = 0; i < t.length; i++) {
    const tok = t[i]!;
    const word = tok.kind === 'word' ? tok.text.toLowerCase() : null;
    if (tok.text === '(') depth++;
    if (tok.text === ')') {
      depth--;
      if (setDepth !== null && depth < setDepth) setDepth = null;
    }
    if (word === 'set') {
      setDepth = depth;
      expectTarget = true;
      continue;
    }
    if (setDepth !== null && depth === setDepth) {
      if (tok.text === ',') {
        expectTarget = true;
        continue;
      }
      if (word && CLAUSE_ENDS.has(word)) setDepth = null;
    }
    if (word === 'operator' && t[i + 1]?.text === '(') {
      let j = i + 2;
      let name = '';
      while (j < t.length && t[j]!.text !== ')') name += t[j++]!.text;
      if (!name.startsWith('pg_catalog.')) found.push(`OPERATOR(${name}), not pg_catalog's`);
      i = j;
      continue;
    }
    if (tok.kind === 'op') {
      if (tok.text === '=' && setDepth !== null && depth === setDepth && expectTarget) {
        expectTarget = false;
        continue;
      }
      // The star of count(*) and SELECT *.
      if (tok.text === '*' && (t[i - 1]?.text === '(' || lower(i - 1) === 'select')) continue;
      found.push(`operator ${tok.text}`);
      continue;
    }
    if (word && tok.text.endsWith('.*')) continue;
    if (word && BANNED.has(word)) {
      found.push(word.toUpperCase());
      continue;
    }
    if (word === 'is' && (lower(i + 1) === 'distinct' || (lower(i + 1) === 'not' && lower(i + 2) === 'distinct'))) {
      found.push('IS DISTINCT FROM');
      continue;
    }
    if (word === 'case' && lower(i + 1) !== 'when') {
      found.push('CASE x WHEN');
      continue;
    }
    if (word && t[i + 1]?.text === '(') {
      if (/^(pg_catalog|outlive)\./.test(word)) continue;
      if (NOT_CALLS.has(word)) continue;
      // An alias's column list (`AS s(id, ...)`), a recursive CTE's (`down(id) AS`).
      if (lower(i - 1) === 'as' || lower(i - 1) === 'recursive') continue;
      found.push(`function ${tok.text}()`);
    }
  }
  return found;
}

const SQL_LIKE = /\b(SELECT|INSERT INTO|UPDATE|DELETE FROM|WHERE|RETURNING|IS NULL|IS NOT NULL|CASE WHEN)\b|\bOPERATOR\(|\boutlive\.[a-z_]+\b/;

/** Every SQL-looking literal in the .ts files under `dir` but `skip`, with what it names unqualified. */
export function findingsIn(dir: string, skip: readonly string[] = []): Finding[] {
  const files: string[] = [];
  const walk = (d: string) => {
    for (const f of readdirSync(d)) {
      const p = path.join(d, f);
      if (statSync(p).isDirectory()) walk(p);
      else if (p.endsWith('.ts') && !skip.includes(p.split(path.sep).join('/'))) files.push(p);
    }
  };
  walk(dir);
  const findings: Finding[] = [];
  for (const file of files) {
    const source = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, true);
    const visit = (node: ts.Node) => {
      let text: string | null = null;
      if (ts.isNoSubstitutionTemplateLiteral(node) || ts.isStringLiteral(node)) text = node.text;
      else if (ts.isTemplateExpression(node)) text = node.head.text + node.templateSpans.map((s) => ` x ${s.literal.text}`).join('');
      // Messages (`outlive: ...`) name functions in prose.
      if (text !== null && SQL_LIKE.test(text) && !/^outlive: /.test(text) && !ts.isImportDeclaration(node.parent)) {
        const line = source.getLineAndCharacterOfPosition(node.getStart()).line + 1;
        for (const what of unqualifiedNames(text)) findings.push({ where: `${file}:${line}`, what });
      }
      ts.forEachChild(node, visit);
    };
    visit(source);
  }
  return findings;
}
