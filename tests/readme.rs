//! The SQL the README and the guide show is the SQL idem generates: each statement a page
//! names is checked where it is shown, and every SQL block of every page must be a generated
//! statement or an excerpt of a shipped migration.

/// A page of the docs, by its path in the repository.
macro_rules! page {
    ($path:literal) => {
        ($path, include_str!(concat!("../", $path)))
    };
}

/// The README and the guide's pages.
const PAGES: [(&str, &str); 14] = [
    page!("README.md"),
    page!("docs/guide/transitions.md"),
    page!("docs/guide/sql.md"),
    page!("docs/guide/inbox.md"),
    page!("docs/guide/http.md"),
    page!("docs/guide/outbox.md"),
    page!("docs/guide/cache.md"),
    page!("docs/guide/scaling.md"),
    page!("docs/guide/observability.md"),
    page!("docs/guide/schema.md"),
    page!("docs/guide/testing.md"),
    page!("docs/guide/proofs.md"),
    page!("docs/guide/schedule.md"),
    page!("docs/guide/operating.md"),
];

const README: &str = PAGES[0].1;
const SQL_PAGE: &str = PAGES[2].1;

/// The ```lang blocks of a page.
fn blocks<'a>(page: &'a str, lang: &str) -> Vec<&'a str> {
    page.split(&format!("```{lang}\n"))
        .skip(1)
        .map(|rest| rest.split("\n```").next().unwrap())
        .collect()
}

#[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(
    table = "orders",
    key = "order_id",
    state = "status",
    version = "version"
)]
enum Order {
    #[state(name = "CREATED", to(Paid, Cancelled))]
    Created,
    #[state(name = "PAID", to(Shipped))]
    Paid,
    #[state(name = "SHIPPED")]
    Shipped,
    #[state(name = "CANCELLED")]
    Cancelled,
}

#[test]
fn readme_shows_the_generated_sql() {
    let sql = Order::IDEM_SQL;
    // The README: the transition's UPDATE and its classifying read.
    let shown = blocks(README, "sql");
    for (what, statement) in [
        ("transition", sql.of(idem::Dialect::Postgres).update),
        ("classification", sql.of(idem::Dialect::Sqlite).classify),
    ] {
        assert!(
            shown.contains(&statement),
            "README.md does not show the {what} as generated:\n{statement}"
        );
    }
    assert_eq!(
        sql.of(idem::Dialect::Sqlite).classify,
        sql.of(idem::Dialect::Postgres).classify
    );
    // The SQL reference: every statement of a transition.
    let reference = blocks(SQL_PAGE, "sql");
    for (what, statement) in [
        (
            "PostgreSQL transition",
            sql.of(idem::Dialect::Postgres).transition,
        ),
        (
            "PostgreSQL transition storing its result",
            sql.of(idem::Dialect::Postgres).transition_storing,
        ),
        ("transition", sql.of(idem::Dialect::Postgres).update),
        (
            "SQLite classification",
            sql.of(idem::Dialect::Sqlite).classify,
        ),
        (
            "result insert",
            sql.of(idem::Dialect::Postgres).store_result,
        ),
        (
            "results table",
            sql.of(idem::Dialect::Postgres).create_results_table,
        ),
    ] {
        assert!(
            reference.contains(&statement),
            "docs/guide/sql.md does not show the {what} as generated:\n{statement}"
        );
    }
    assert_eq!(
        sql.of(idem::Dialect::Postgres).store_result,
        sql.of(idem::Dialect::Sqlite).store_result
    );
    // SQLite's transition is that UPDATE with its own increment, which the reference shows.
    let sqlite = sql.of(idem::Dialect::Sqlite).transition;
    let increment = sqlite
        .split("\"version\" = ")
        .nth(1)
        .and_then(|rest| rest.split('\n').next())
        .unwrap();
    assert!(increment.starts_with("CASE"), "{sqlite}");
    assert!(
        SQL_PAGE.contains(&format!("`{increment}`")),
        "docs/guide/sql.md does not show SQLite's increment as generated:\n{increment}"
    );
    assert_eq!(
        sqlite.replace(increment, "\"version\" + 1"),
        sql.of(idem::Dialect::Postgres).update
    );
    // MySQL's, as sent: each `$n` a `?` of its own.
    let mysql = sql.of(idem::Dialect::MySql);
    let classify = idem_sql::placeholder::positional(mysql.classify).text;
    assert!(
        reference.contains(&&*classify),
        "docs/guide/sql.md does not show MySQL's classifying read as sent:\n{classify}"
    );
    let upsert = "ON DUPLICATE KEY UPDATE result = VALUES(result)";
    assert!(
        mysql.store_result.contains(upsert),
        "{}",
        mysql.store_result
    );
    assert!(
        SQL_PAGE.contains(upsert),
        "docs/guide/sql.md names MySQL's result upsert"
    );
}

#[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "tenant_orders", key = ("tenant_id", "order_id"), state = "status")]
enum TenantOrder {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

/// The guide's `set(paid_at = now(), amount = "amount_cents")` handler's UPDATE, built as
/// the runtime builds it.
fn set_columns_update() -> String {
    use idem::Machine;
    use idem_sql::transition::{Assignment, Names, SetTo, postgres};
    let d = Order::DEFINITION;
    let names = Names {
        table: d.table,
        key: d.key_columns,
        state: d.state_column,
        version: d.version_column,
        results: d.results_table,
    };
    let set = [
        Assignment {
            column: "paid_at",
            value: SetTo::Now,
        },
        Assignment {
            column: "amount",
            value: SetTo::Bound,
        },
    ];
    postgres(&names, &set).update.to_owned()
}

#[test]
fn readme_shows_the_sql_of_a_handler_that_sets_columns() {
    let update = set_columns_update();
    assert!(
        SQL_PAGE.contains(&format!("```sql\n{update}\n```")),
        "docs/guide/sql.md does not show the UPDATE with columns set as generated:\n{update}"
    );
    assert!(
        PAGES[1]
            .1
            .contains("set(paid_at = now(), amount = \"amount_cents\"))]")
    );
}

#[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "accounts", key = "account_id", state = "status")]
enum Account {
    #[state(name = "OPEN", to(Closed))]
    Open,
    #[state(name = "CLOSED")]
    Closed,
}

#[test]
fn readme_shows_the_watermark_sql() {
    let page = SQL_PAGE;
    let update = Account::IDEM_SQL.of(idem::Dialect::Sqlite).update_watermark;
    assert!(
        page.contains(&format!("```sql\n{update}\n```")),
        "docs/guide/sql.md does not show the watermark UPDATE as generated:\n{update}"
    );
}

/// The guide's `create_order`'s INSERT, built as the runtime builds it.
fn creation_insert() -> String {
    use idem_sql::transition::{Assignment, Names, SetTo, sqlite};
    let names = Names {
        table: "pay_orders",
        key: &["out_trade_no"],
        state: "status",
        version: "version",
        results: "idem_results",
    };
    let bound = |column| Assignment {
        column,
        value: SetTo::Bound,
    };
    let set = [
        bound("amount"),
        bound("customer"),
        Assignment {
            column: "created_at",
            value: SetTo::Now,
        },
    ];
    sqlite(&names, &set).create.to_owned()
}

#[test]
fn readme_shows_the_creation_sql() {
    let create = creation_insert();
    assert!(
        SQL_PAGE.contains(&format!("```sql\n{create}\n```")),
        "docs/guide/sql.md does not show the creation INSERT as generated:\n{create}"
    );
}

/// Every statement of a machine, on every backend (MySQL's also as sent, with `?`).
fn statements_of(sql: &idem::MachineSql) -> Vec<String> {
    let mut all = Vec::new();
    for dialect in [
        idem::Dialect::Postgres,
        idem::Dialect::Sqlite,
        idem::Dialect::MySql,
    ] {
        let s = sql.of(dialect);
        for statement in [
            s.transition,
            s.transition_guarded,
            s.transition_storing,
            s.transition_storing_guarded,
            s.transition_watermark,
            s.transition_storing_watermark,
            s.update_watermark,
            s.update,
            s.update_guarded,
            s.classify,
            s.classify_unlocked,
            s.store_result,
            s.create_results_table,
            s.create,
            s.classify_created,
            s.create_storing,
            s.enforce,
        ] {
            all.push(statement.to_owned());
            if dialect == idem::Dialect::MySql {
                all.push(
                    idem_sql::placeholder::positional(statement)
                        .text
                        .into_owned(),
                );
            }
        }
    }
    all
}

/// A statement's words, one space apart (its line breaks and indents are for reading), with
/// no space inside parentheses.
fn words(statement: &str) -> String {
    statement
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace("( ", "(")
        .replace(" )", ")")
}

/// A migration's statements without its comments, one per `;`.
fn migration_statements(migration: &str) -> Vec<String> {
    let text: String = migration
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .map(|line| format!("{line}\n"))
        .collect();
    text.split(';')
        .map(|statement| statement.trim().to_owned())
        .filter(|statement| !statement.is_empty())
        .collect()
}

/// No page shows SQL that idem does not generate or ship: every ```sql block of the README
/// and the guide is a statement the machines here generate, or statements of a migration.
#[test]
fn every_sql_block_shown_is_generated() {
    let mut generated = statements_of(Order::IDEM_SQL);
    generated.extend(statements_of(TenantOrder::IDEM_SQL));
    generated.extend(statements_of(Account::IDEM_SQL));
    generated.push(set_columns_update());
    generated.push(creation_insert());
    let migrated: Vec<String> = [
        idem::inbox::POSTGRES_MIGRATION,
        idem::inbox::SQLITE_MIGRATION,
        idem::inbox::MYSQL_MIGRATION,
    ]
    .into_iter()
    .flat_map(migration_statements)
    .collect();
    // The outbox's statements (and the HTTP layer's optimistic insert) are one line each;
    // the guide shows them broken into lines.
    let outbox: Vec<String> = [
        idem::Dialect::Postgres,
        idem::Dialect::Sqlite,
        idem::Dialect::MySql,
    ]
    .into_iter()
    .flat_map(|dialect| {
        let sql = dialect.outbox();
        [
            sql.insert.clone(),
            sql.claim.clone(),
            sql.lock(1),
            sql.published(2),
            sql.failed.clone(),
            sql.purge.clone(),
            dialect.inbox().insert_done.clone(),
            dialect.leases().job_occur.clone(),
            dialect.leases().lease_acquire.clone(),
        ]
    })
    .map(|statement| words(&statement))
    .collect();
    let mut checked = 0;
    for (name, page) in PAGES {
        for block in blocks(page, "sql") {
            let known = generated.iter().any(|statement| statement == block)
                || outbox.contains(&words(block))
                || block
                    .split(';')
                    .map(str::trim)
                    .filter(|statement| !statement.is_empty())
                    .all(|statement| migrated.iter().any(|m| m == statement));
            assert!(
                known,
                "{name} shows SQL that idem neither generates nor ships:\n{block}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 18, "the docs show {checked} SQL blocks");
}

#[test]
fn readme_shows_the_composite_key_sql() {
    let page = SQL_PAGE;
    let update = TenantOrder::IDEM_SQL.of(idem::Dialect::Postgres).update;
    assert!(
        page.contains(&format!("```sql\n{update}\n```")),
        "docs/guide/sql.md does not show the composite-key UPDATE as generated:\n{update}"
    );
}

#[test]
fn readme_shows_the_inbox_schema() {
    // The guide's inbox page shows it.
    let readme = include_str!("../docs/guide/inbox.md");
    let migration = idem::inbox::POSTGRES_MIGRATION;
    let table = migration
        .split(';')
        .find(|s| s.contains("CREATE TABLE IF NOT EXISTS idem_inbox"))
        .unwrap();
    let table = table[table.find("CREATE TABLE").unwrap()..].trim();
    assert!(
        readme.contains(table),
        "docs/guide/inbox.md does not show the inbox table as migrated"
    );
    let last = migration
        .split(';')
        .find(|s| s.contains("DROP CONSTRAINT IF EXISTS idem_inbox_status_check"))
        .unwrap()
        .trim();
    let last = last
        .lines()
        .filter(|l| !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        readme.contains(&format!("{last};")),
        "docs/guide/inbox.md does not show PostgreSQL's migration of the inbox:\n{last}"
    );
}

/// The migrations create the same default results table as `create_results_table`.
#[test]
fn migrations_create_the_results_table_the_derive_describes() {
    let sql = Order::IDEM_SQL;
    for (migration, ddl) in [
        (
            idem::inbox::POSTGRES_MIGRATION,
            sql.of(idem::Dialect::Postgres).create_results_table,
        ),
        (
            idem::inbox::SQLITE_MIGRATION,
            sql.of(idem::Dialect::Sqlite).create_results_table,
        ),
    ] {
        // The derive quotes identifiers; the migration, written by hand, does not.
        let ddl = ddl.replace('"', "");
        assert!(
            migration.contains(&ddl),
            "the migration drifted from:\n{ddl}"
        );
    }
}

/// The README's picture of the order machine is the one the derive draws, in a grey that
/// reads on light and dark pages (in rustdoc it takes the text's colour)
/// (`IDEM_BLESS=1 cargo test -p idem --test suite -- readme::` rewrites it after a reviewed change).
#[test]
fn readme_shows_the_machine_as_drawn() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/order-machine.svg");
    let drawn = Order::IDEM_GRAPH.replacen("<svg ", "<svg style=\"color: #808080\" ", 1);
    if std::env::var("IDEM_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(path, format!("{drawn}\n")).unwrap();
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert_eq!(
        committed.trim_end(),
        drawn,
        "docs/order-machine.svg differs from the drawing of the README's machine"
    );
    assert!(
        README.contains("](docs/order-machine.svg)"),
        "README.md shows the picture"
    );
}

#[test]
fn readme_shows_the_enforcing_sql() {
    // The guide's schema page shows it.
    let readme = include_str!("../docs/guide/schema.md");
    let enforce = Order::IDEM_SQL.of(idem::Dialect::Postgres).enforce;
    assert!(
        readme.contains(&format!("```sql\n{enforce}\n```")),
        "docs/guide/schema.md does not show the enforcing script as generated:\n{enforce}"
    );
}

/// The compile errors the docs quote are the ones trybuild pins: each ```text block that
/// points into `tests/ui/fail/` (as rustc prints the path, from `ui/`'s package) is a
/// message of that file's `.stderr`, as rustc prints it.
#[test]
fn readme_quotes_the_compile_errors_as_pinned() {
    let readme: String = PAGES.iter().map(|(_, page)| *page).collect();
    let mut quoted = 0;
    for block in blocks(&readme, "text") {
        let Some(path) = block
            .lines()
            .find_map(|line| line.trim_start().strip_prefix("--> tests/ui/fail/"))
        else {
            continue;
        };
        let file = path.split(':').next().unwrap().replace(".rs", ".stderr");
        let pinned = std::fs::read_to_string(format!(
            "{}/ui/tests/ui/fail/{file}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap_or_else(|e| panic!("the docs quote tests/ui/fail/{file}: {e}"));
        assert!(
            pinned.contains(block),
            "the docs quote a message of tests/ui/fail/{file} that it does not pin:\n{block}"
        );
        quoted += 1;
    }
    assert!(quoted >= 3, "the docs quote {quoted} compile errors");
}
