//! The SQL the README shows is the SQL idem generates for the README's machine.

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
    let readme = include_str!("../README.md");
    let blocks: Vec<&str> = readme
        .split("```sql\n")
        .skip(1)
        .map(|rest| rest.split("\n```").next().unwrap())
        .collect();
    let sql = Order::IDEM_SQL;
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
            blocks.contains(&statement),
            "README.md does not show the {what} as generated:\n{statement}"
        );
    }
    assert_eq!(
        sql.of(idem::Dialect::Postgres).store_result,
        sql.of(idem::Dialect::Sqlite).store_result
    );
    // SQLite's transition is that UPDATE with its own increment, which the README shows.
    let sqlite = sql.of(idem::Dialect::Sqlite).transition;
    let increment = sqlite
        .split("\"version\" = ")
        .nth(1)
        .and_then(|rest| rest.split('\n').next())
        .unwrap();
    assert!(increment.starts_with("CASE"), "{sqlite}");
    assert!(
        readme.contains(&format!("`{increment}`")),
        "README.md does not show SQLite's increment as generated:\n{increment}"
    );
    assert_eq!(
        sqlite.replace(increment, "\"version\" + 1"),
        sql.of(idem::Dialect::Postgres).update
    );
    // MySQL's, as sent: each `$n` a `?` of its own.
    let mysql = sql.of(idem::Dialect::MySql);
    let classify = idem_sql::placeholder::positional(mysql.classify).text;
    assert!(
        blocks.contains(&&*classify),
        "README.md does not show MySQL's classifying read as sent:\n{classify}"
    );
    let upsert = "ON DUPLICATE KEY UPDATE result = VALUES(result)";
    assert!(
        mysql.store_result.contains(upsert),
        "{}",
        mysql.store_result
    );
    assert!(
        readme.contains(upsert),
        "README.md names MySQL's result upsert"
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

/// The README's `set(paid_at = now(), amount = "amount_cents")` handler, built as the
/// runtime builds it.
#[test]
fn readme_shows_the_sql_of_a_handler_that_sets_columns() {
    use idem::Machine;
    use idem_sql::transition::{Assignment, Names, SetTo, postgres};
    let readme = include_str!("../README.md");
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
    let update = postgres(&names, &set).update;
    assert!(
        readme.contains(&format!("```sql\n{update}\n```")),
        "README.md does not show the UPDATE with columns set as generated:\n{update}"
    );
    assert!(readme.contains("set(paid_at = now(), amount = \"amount_cents\"))]"));
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
    let readme = include_str!("../README.md");
    let update = Account::IDEM_SQL.of(idem::Dialect::Sqlite).update_watermark;
    assert!(
        readme.contains(&format!("```sql\n{update}\n```")),
        "README.md does not show the watermark UPDATE as generated:\n{update}"
    );
}

/// The README's `create_order`, built as the runtime builds it.
#[test]
fn readme_shows_the_creation_sql() {
    use idem_sql::transition::{Assignment, Names, SetTo, sqlite};
    let readme = include_str!("../README.md");
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
    let create = sqlite(&names, &set).create;
    assert!(
        readme.contains(&format!("```sql\n{create}\n```")),
        "README.md does not show the creation INSERT as generated:\n{create}"
    );
}

#[test]
fn readme_shows_the_composite_key_sql() {
    let readme = include_str!("../README.md");
    let update = TenantOrder::IDEM_SQL.of(idem::Dialect::Postgres).update;
    assert!(
        readme.contains(&format!("```sql\n{update}\n```")),
        "README.md does not show the composite-key UPDATE as generated:\n{update}"
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
    let last = migration.trim_end().trim_end_matches(';');
    let last = last[last.rfind(';').unwrap() + 1..].trim();
    let last = last
        .lines()
        .filter(|l| !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        readme.contains(&format!("{last};")),
        "docs/guide/inbox.md does not show PostgreSQL's last migration:\n{last}"
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
    let readme = include_str!("../README.md");
    assert!(
        readme.contains("](docs/order-machine.svg)"),
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

/// The compile errors the README quotes are the ones trybuild pins: each ```text block that
/// points into `tests/ui/fail/` is a message of that file's `.stderr`, as rustc prints it.
#[test]
fn readme_quotes_the_compile_errors_as_pinned() {
    // The README and the guide's pages.
    let readme = [
        include_str!("../README.md"),
        include_str!("../docs/guide/inbox.md"),
        include_str!("../docs/guide/http.md"),
        include_str!("../docs/guide/schema.md"),
    ]
    .concat();
    let mut quoted = 0;
    for block in readme
        .split("```text\n")
        .skip(1)
        .map(|rest| rest.split("\n```").next().unwrap())
    {
        let Some(path) = block
            .lines()
            .find_map(|line| line.trim_start().strip_prefix("--> tests/ui/fail/"))
        else {
            continue;
        };
        let file = path.split(':').next().unwrap().replace(".rs", ".stderr");
        let pinned = std::fs::read_to_string(format!("tests/ui/fail/{file}"))
            .unwrap_or_else(|e| panic!("README.md quotes tests/ui/fail/{file}: {e}"));
        assert!(
            pinned.contains(block),
            "README.md quotes a message of tests/ui/fail/{file} that it does not pin:\n{block}"
        );
        quoted += 1;
    }
    assert!(quoted >= 3, "README.md quotes {quoted} compile errors");
}
