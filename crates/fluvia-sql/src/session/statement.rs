//! The statements of a SQL session, as Flink's SQL client takes them:
//! queries, `INSERT INTO`, `CREATE TABLE ... WITH`, `CREATE [TEMPORARY]
//! VIEW`, `DROP`, `SHOW TABLES`, `DESCRIBE`, `SET`, `RESET`, `EXPLAIN`,
//! and DataFusion's own `CREATE EXTERNAL TABLE` and `COPY`.
//!
//! This module only reads text; what a statement does is the session's.

use crate::session::catalog::{self, TableDef, object_name};
use datafusion::sql::parser::{DFParser, Statement as DfStatement};
use datafusion::sql::sqlparser::ast::{self, ObjectType};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use fluvia_core::{FluviaError, Result};

/// One statement of a session.
#[derive(Debug, Clone)]
pub enum Statement {
    /// A query (or anything else DataFusion plans: `COPY ... TO`).
    Query(String),
    Insert {
        table: String,
        /// The target columns named after the table, if any.
        columns: Vec<String>,
        query: String,
        overwrite: bool,
    },
    CreateTable {
        def: TableDef,
        if_not_exists: bool,
        or_replace: bool,
    },
    /// DataFusion's `CREATE EXTERNAL TABLE`, kept as written.
    CreateExternal {
        name: String,
        sql: String,
        if_not_exists: bool,
    },
    CreateView {
        name: String,
        query: String,
        or_replace: bool,
        if_not_exists: bool,
    },
    Drop {
        name: String,
        view: bool,
        if_exists: bool,
    },
    ShowTables,
    ShowViews,
    Describe(String),
    /// `SET` lists the session's settings; `SET 'k' = 'v'` sets one.
    Set(Option<(String, String)>),
    /// `RESET` clears every setting of the session; `RESET 'k'` one.
    Reset(Option<String>),
    /// `EXPLAIN [PLAN FOR] <query or INSERT>`: the JobGraph.
    Explain(Box<Statement>),
}

/// Splits text into statements at `;` outside quotes and comments; blank
/// statements are dropped. Comments stay in the statement's text.
pub fn split_statements(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' | '`' => {
                current.push(c);
                // A doubled quote inside is an escaped quote: the loop
                // closes and reopens, which keeps the text as it was.
                for d in chars.by_ref() {
                    current.push(d);
                    if d == c {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                current.push(c);
                for d in chars.by_ref() {
                    current.push(d);
                    if d == '\n' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                current.push(c);
                let mut prev = ' ';
                for d in chars.by_ref() {
                    current.push(d);
                    if prev == '*' && d == '/' {
                        break;
                    }
                    prev = d;
                }
            }
            ';' => out.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    out.push(current);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !is_blank(s))
        .collect()
}

/// Whether `text` holds nothing but whitespace and comments.
pub fn is_blank(text: &str) -> bool {
    let mut rest = text.trim_start();
    loop {
        if rest.is_empty() {
            return true;
        }
        if let Some(r) = rest.strip_prefix("--") {
            rest = r.split_once('\n').map_or("", |(_, r)| r).trim_start();
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.split_once("*/").map_or("", |(_, r)| r).trim_start();
        } else {
            return false;
        }
    }
}

/// `text` without its comments (each replaced by a space), and whether a
/// quote is still open at its end.
pub fn strip_comments(text: &str) -> (String, bool) {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' | '`' => {
                out.push(c);
                let mut closed = false;
                for d in chars.by_ref() {
                    out.push(d);
                    if d == c {
                        closed = true;
                        break;
                    }
                }
                if !closed {
                    return (out, true);
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
                out.push(' ');
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = ' ';
                for d in chars.by_ref() {
                    if prev == '*' && d == '/' {
                        break;
                    }
                    prev = d;
                }
                out.push(' ');
            }
            _ => out.push(c),
        }
    }
    (out, false)
}

/// Whether `text` ends a statement: its last `;` outside quotes and
/// comments is followed by nothing but blanks and comments (what the
/// interactive client waits for before it runs what was typed).
pub fn is_complete(text: &str) -> bool {
    let (code, open_quote) = strip_comments(text);
    !open_quote && code.trim_end().ends_with(';')
}

/// The words of `sql` up to the first that is not a plain word (for the
/// statements this module reads before DataFusion's parser sees them).
fn leading_words(sql: &str, n: usize) -> Vec<String> {
    sql.split(|c: char| c.is_whitespace() || c == ';')
        .filter(|w| !w.is_empty())
        .take(n)
        .map(|w| w.to_ascii_uppercase())
        .collect()
}

/// Strips the first `n` words of `sql`.
fn after_words(sql: &str, n: usize) -> &str {
    let mut rest = sql.trim_start();
    for _ in 0..n {
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        rest = rest[end..].trim_start();
    }
    rest
}

/// A `'quoted'` or bare key or value of SET / RESET.
fn unquote(s: &str) -> Result<String> {
    let s = s.trim();
    for q in ['\'', '"', '`'] {
        if let Some(inner) = s.strip_prefix(q) {
            let Some(inner) = inner.strip_suffix(q) else {
                return Err(FluviaError::Plan(format!("unterminated quote in {s}")));
            };
            return Ok(inner.replace(&format!("{q}{q}"), &q.to_string()));
        }
    }
    Ok(s.to_string())
}

fn set_statement(rest: &str) -> Result<Statement> {
    let rest = rest.trim().trim_end_matches(';').trim();
    if rest.is_empty() {
        return Ok(Statement::Set(None));
    }
    // Split at the first '=' outside quotes.
    let mut quote = None;
    let mut at = None;
    for (i, c) in rest.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"' | '`') => quote = Some(c),
            (None, '=') => {
                at = Some(i);
                break;
            }
            _ => {}
        }
    }
    let Some(at) = at else {
        return Err(FluviaError::Plan(format!(
            "SET {rest}: expected SET 'key' = 'value'"
        )));
    };
    let key = unquote(&rest[..at])?;
    let value = unquote(&rest[at + 1..])?;
    if key.is_empty() {
        return Err(FluviaError::Plan("SET: the key is empty".into()));
    }
    Ok(Statement::Set(Some((key, value))))
}

/// Reads one statement.
pub fn parse(sql: &str) -> Result<Statement> {
    // Comments say nothing to any statement; the hand-read ones (SET,
    // RESET, EXPLAIN) must not see them as words.
    let (code, _) = strip_comments(sql);
    let sql = code.trim().trim_end_matches(';').trim();
    let words = leading_words(sql, 3);
    let word = |i: usize| words.get(i).map(String::as_str);
    match (word(0), word(1), word(2)) {
        (Some("SET"), _, _) => return set_statement(after_words(sql, 1)),
        (Some("RESET"), None, _) => return Ok(Statement::Reset(None)),
        (Some("RESET"), Some(_), _) => {
            return Ok(Statement::Reset(Some(unquote(after_words(sql, 1))?)));
        }
        (Some("EXPLAIN"), Some("PLAN"), Some("FOR")) => {
            return Ok(Statement::Explain(Box::new(parse(after_words(sql, 3))?)));
        }
        (Some("EXPLAIN"), Some(w), _)
            if !matches!(w, "ANALYZE" | "VERBOSE" | "FORMAT") && !w.starts_with('(') =>
        {
            return Ok(Statement::Explain(Box::new(parse(after_words(sql, 1))?)));
        }
        (Some("SHOW"), Some("VIEWS"), None) => return Ok(Statement::ShowViews),
        _ => {}
    }
    let mut parsed = DFParser::parse_sql_with_dialect(sql, &GenericDialect {})
        .map_err(|e| FluviaError::Plan(format!("SQL error: {e}")))?;
    if parsed.len() != 1 {
        return Err(FluviaError::Plan(format!(
            "expected one statement, found {}",
            parsed.len()
        )));
    }
    let Some(statement) = parsed.pop_front() else {
        return Err(FluviaError::Plan("no statement".into()));
    };
    let s = match statement {
        DfStatement::CreateExternalTable(c) => Statement::CreateExternal {
            name: object_name(&c.name),
            sql: sql.to_string(),
            if_not_exists: c.if_not_exists,
        },
        DfStatement::Statement(s) => match *s {
            ast::Statement::CreateTable(ct) => Statement::CreateTable {
                if_not_exists: ct.if_not_exists,
                or_replace: ct.or_replace,
                def: catalog::table_def(&ct)?,
            },
            ast::Statement::CreateView(v) => {
                if v.materialized {
                    return Err(FluviaError::Plan(
                        "materialized views are not supported; CREATE [TEMPORARY] VIEW".into(),
                    ));
                }
                if !v.columns.is_empty() {
                    return Err(FluviaError::Plan(format!(
                        "CREATE VIEW {}: name the columns in the query (AS ...) instead",
                        v.name
                    )));
                }
                Statement::CreateView {
                    name: object_name(&v.name),
                    query: v.query.to_string(),
                    or_replace: v.or_replace,
                    if_not_exists: v.if_not_exists,
                }
            }
            ast::Statement::Drop {
                object_type,
                if_exists,
                names,
                ..
            } => {
                let view = match object_type {
                    ObjectType::Table => false,
                    ObjectType::View => true,
                    other => {
                        return Err(FluviaError::Plan(format!(
                            "DROP {other} is not supported; DROP TABLE or DROP VIEW"
                        )));
                    }
                };
                let [name] = names.as_slice() else {
                    return Err(FluviaError::Plan("DROP one table or view at a time".into()));
                };
                Statement::Drop {
                    name: object_name(name),
                    view,
                    if_exists,
                }
            }
            ast::Statement::ShowTables { .. } => Statement::ShowTables,
            ast::Statement::ExplainTable { table_name, .. } => {
                Statement::Describe(object_name(&table_name))
            }
            ast::Statement::Insert(ins) => {
                let ast::TableObject::TableName(table) = &ins.table else {
                    return Err(FluviaError::Plan(
                        "INSERT INTO takes a table name".to_string(),
                    ));
                };
                let Some(source) = &ins.source else {
                    return Err(FluviaError::Plan(format!(
                        "INSERT INTO {table}: expected a query (SELECT or VALUES)"
                    )));
                };
                if ins.partitioned.is_some() {
                    return Err(FluviaError::Plan(format!(
                        "INSERT INTO {table}: PARTITION is not supported"
                    )));
                }
                Statement::Insert {
                    table: object_name(table),
                    columns: ins.columns.iter().map(object_name).collect(),
                    query: source.to_string(),
                    overwrite: ins.overwrite,
                }
            }
            _ => Statement::Query(sql.to_string()),
        },
        _ => Statement::Query(sql.to_string()),
    };
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_semicolons_outside_quotes_and_comments() {
        let s = split_statements(
            "CREATE TABLE t (a INT) WITH ('csv.field-delimiter' = ';'); -- a; comment\n\
             SELECT 'x;y' AS \"c;d\" /* ; */ FROM t;;\n  ",
        );
        assert_eq!(s.len(), 2, "{s:?}");
        assert!(s[0].ends_with("= ';')"), "{}", s[0]);
        assert!(s[1].starts_with("-- a; comment"), "{}", s[1]);
        assert!(s[1].ends_with("FROM t"), "{}", s[1]);
        assert!(split_statements(" -- only a comment\n").is_empty());
    }

    #[test]
    fn completeness_waits_for_a_semicolon_outside_quotes() {
        assert!(!is_complete("SELECT 1"));
        assert!(!is_complete("SELECT ';"));
        assert!(is_complete("SELECT ';';  "));
        assert!(is_complete("SELECT 1; -- done"));
        assert!(!is_complete("SELECT 1; SELECT"));
        assert!(is_complete("SELECT 1 AS x /* it's */;"));
        assert!(is_complete("SELECT 1; /* done */"));
        assert!(!is_complete("SELECT 1 /* ; */"));
    }

    #[test]
    fn reads_flink_ddl() {
        let s = parse(
            "CREATE TABLE Orders (id BIGINT NOT NULL, zip STRING, price DECIMAL(7, 2), \
             at TIMESTAMP(3)) WITH ('connector' = 'filesystem', 'path' = '/data/o', \
             'format' = 'csv', 'csv.field-delimiter' = '|', 'csv.ignore-parse-errors' = 'true')",
        )
        .expect("parses");
        let Statement::CreateTable {
            def, if_not_exists, ..
        } = s
        else {
            panic!("not a CREATE TABLE: {s:?}");
        };
        assert!(!if_not_exists);
        assert_eq!(def.name, "orders");
        assert_eq!(def.csv.delimiter, b'|');
        assert!(def.csv.ignore_parse_errors);
        let f = def.schema.fields();
        assert_eq!(f.len(), 4);
        assert!(!f[0].is_nullable());
        assert_eq!(f[1].data_type().to_string(), "Utf8");
        assert_eq!(f[2].data_type().to_string(), "Decimal128(7, 2)");
        assert_eq!(f[3].data_type().to_string(), "Timestamp(ms)");
    }

    #[test]
    fn ddl_errors_name_the_problem() {
        let err = |sql: &str| parse(sql).expect_err(sql).to_string();
        let e = err(
            "CREATE TABLE t (a INT) WITH ('connector' = 'filesystem', 'path' = '/x', 'format' = 'csv', 'csv.delimiter' = ';')",
        );
        assert!(e.contains("unknown option 'csv.delimiter'"), "{e}");
        let e = err("CREATE TABLE t (a INT) WITH ('connector' = 'filesystem', 'format' = 'csv')");
        assert!(e.contains("missing option 'path'"), "{e}");
        let e = err(
            "CREATE TABLE t (a INT, b GEOMETRY) WITH ('connector' = 'filesystem', 'path' = '/x', 'format' = 'csv')",
        );
        assert!(e.contains("column 'b' has type GEOMETRY"), "{e}");
        let e = err(
            "CREATE TABLE t (a INT) WITH ('connector' = 'kafka', 'path' = '/x', 'format' = 'csv')",
        );
        assert!(e.contains("connector 'kafka'"), "{e}");
    }

    #[test]
    fn reads_session_statements() {
        assert!(matches!(
            parse("SET 'parallelism.default' = '4'").expect("set"),
            Statement::Set(Some((k, v))) if k == "parallelism.default" && v == "4"
        ));
        assert!(matches!(parse("SET").expect("set"), Statement::Set(None)));
        assert!(matches!(
            parse("-- settings\nSET 'a.b' = 'c' -- why").expect("set"),
            Statement::Set(Some((k, v))) if k == "a.b" && v == "c"
        ));
        assert!(matches!(
            parse("/* all */ RESET -- everything").expect("reset"),
            Statement::Reset(None)
        ));
        assert!(matches!(
            parse("/* c */ EXPLAIN SELECT 1").expect("explain"),
            Statement::Explain(_)
        ));
        assert!(matches!(
            parse("RESET 'parallelism.default';").expect("reset"),
            Statement::Reset(Some(k)) if k == "parallelism.default"
        ));
        assert!(matches!(
            parse("SHOW TABLES").expect("show"),
            Statement::ShowTables
        ));
        assert!(matches!(
            parse("DESCRIBE Orders").expect("describe"),
            Statement::Describe(t) if t == "orders"
        ));
        assert!(matches!(
            parse("EXPLAIN PLAN FOR SELECT 1").expect("explain"),
            Statement::Explain(q) if matches!(*q, Statement::Query(_))
        ));
        let Statement::Insert { table, query, .. } =
            parse("INSERT INTO sink SELECT a FROM src WHERE a > 1").expect("insert")
        else {
            panic!("not an insert");
        };
        assert_eq!(table, "sink");
        assert!(query.contains("WHERE a > 1"), "{query}");
        assert!(matches!(
            parse("CREATE TEMPORARY VIEW v AS SELECT 1 AS x").expect("view"),
            Statement::CreateView { name, .. } if name == "v"
        ));
        assert!(matches!(
            parse("DROP TABLE IF EXISTS t").expect("drop"),
            Statement::Drop {
                view: false,
                if_exists: true,
                ..
            }
        ));
    }
}
