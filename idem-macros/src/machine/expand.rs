//! The code `#[derive(StateMachine)]` generates: an `idem::Machine` impl whose definition,
//! SQL included, is a constant, and a documented `IDEM_SQL` constant on the enum.

use super::check::Checked;
use super::graph;
use idem_sql::dialect::Dialect;
use idem_sql::enforce;
use idem_sql::placeholder::positional;
use idem_sql::transition::{Names, Statements};
use proc_macro2::TokenStream;
use quote::quote;

pub fn expand(m: &Checked) -> TokenStream {
    let ident = &m.ident;
    let name = ident.to_string();
    let (table, key, state, version, results, id) =
        (&m.table, &m.key, &m.state, &m.version, &m.results, &m.id);
    let key_columns: Vec<&str> = key.iter().map(String::as_str).collect();
    let names = Names {
        table,
        key: &key_columns,
        state,
        version,
        results,
    };
    let statements = Dialect::ALL.map(|dialect| dialect.statements(&names, &[]));
    let state_names = m.states.iter().map(|(_, n)| n);
    let variants_by_index = m
        .states
        .iter()
        .enumerate()
        .map(|(i, (v, _))| quote!(#i => #ident::#v));
    let index_by_variant = m
        .states
        .iter()
        .enumerate()
        .map(|(i, (v, _))| quote!(#ident::#v => #i));
    let transitions = m.transitions.iter().map(|(a, b)| quote!((#a, #b)));
    let reachable = m.reachable.iter().map(|(a, b)| quote!((#a, #b)));
    let state_db_names: Vec<&str> = m.states.iter().map(|(_, n)| n.as_str()).collect();
    let enforced = enforce::Machine {
        name: &name,
        table,
        state,
        states: &state_db_names,
        transitions: &m.transitions,
    };
    let scripts = Dialect::ALL.map(|dialect| enforced.script(dialect));
    let per_dialect = statements
        .iter()
        .zip(&scripts)
        .map(|(s, enforce)| statements_tokens(s, enforce));
    let doc = sql_doc(m, &statements, &scripts);
    let picture = graph::svg(&name, &state_db_names, &m.transitions);
    let graph_doc = graph_doc(m, &picture);
    quote! {
        const _: () = {
            impl ::idem::Machine for #ident {
                const DEFINITION: &'static ::idem::Definition = &::idem::Definition {
                    name: #name,
                    id: #id,
                    table: #table,
                    key_columns: &[#(#key),*],
                    state_column: #state,
                    version_column: #version,
                    results_table: #results,
                    states: &[#(#state_names),*],
                    transitions: &[#(#transitions),*],
                    reachable: &[#(#reachable),*],
                    sql: ::idem::MachineSql::new([#(#per_dialect),*]),
                };

                fn from_index(index: usize) -> Self {
                    match index {
                        #(#variants_by_index,)*
                        _ => ::core::panic!("state index out of range"),
                    }
                }

                fn index(self) -> usize {
                    match self {
                        #(#index_by_variant,)*
                    }
                }
            }

            impl #ident {
                #[doc = #doc]
                pub const IDEM_SQL: &'static ::idem::MachineSql =
                    &<#ident as ::idem::Machine>::DEFINITION.sql;

                #[doc = #graph_doc]
                pub const IDEM_GRAPH: &'static str = ::idem::__private::picture(#picture);
            }
        };
    }
}

/// After an error: an impl with no states, so code naming the machine does not drown in
/// follow-on errors about a missing `Machine` impl.
pub fn fallback(input: &syn::DeriveInput) -> TokenStream {
    let ident = &input.ident;
    if !input.generics.params.is_empty() || !matches!(input.data, syn::Data::Enum(_)) {
        return TokenStream::new();
    }
    let empty = quote!(::idem::Statements {
        transition: "",
        transition_guarded: "",
        transition_storing: "",
        transition_storing_guarded: "",
        transition_watermark: "",
        transition_storing_watermark: "",
        update_watermark: "",
        update: "",
        update_guarded: "",
        classify: "",
        classify_unlocked: "",
        store_result: "",
        create_results_table: "",
        create: "",
        classify_created: "",
        create_storing: "",
        enforce: "",
    });
    let name = ident.to_string();
    let empties = Dialect::ALL.map(|_| &empty);
    quote! {
        const _: () = {
            impl ::idem::Machine for #ident {
                const DEFINITION: &'static ::idem::Definition = &::idem::Definition {
                    name: #name, id: "", table: "", key_columns: &[], state_column: "", version_column: "",
                    results_table: "", states: &[], transitions: &[], reachable: &[],
                    sql: ::idem::MachineSql::new([#(#empties),*]),
                };
                fn from_index(_: usize) -> Self { ::core::unreachable!() }
                fn index(self) -> usize { ::core::unreachable!() }
            }
        };
    }
}

fn statements_tokens(s: &Statements, enforce: &str) -> TokenStream {
    let Statements {
        transition,
        transition_guarded,
        transition_storing,
        transition_storing_guarded,
        transition_watermark,
        transition_storing_watermark,
        update_watermark,
        update,
        update_guarded,
        classify,
        classify_unlocked,
        store_result,
        create_results_table,
        create,
        classify_created,
        create_storing,
    } = s;
    quote! {
        ::idem::Statements {
            transition: #transition,
            transition_guarded: #transition_guarded,
            transition_storing: #transition_storing,
            transition_storing_guarded: #transition_storing_guarded,
            transition_watermark: #transition_watermark,
            transition_storing_watermark: #transition_storing_watermark,
            update_watermark: #update_watermark,
            update: #update,
            update_guarded: #update_guarded,
            classify: #classify,
            classify_unlocked: #classify_unlocked,
            store_result: #store_result,
            create_results_table: #create_results_table,
            create: #create,
            classify_created: #classify_created,
            create_storing: #create_storing,
            enforce: #enforce,
        }
    }
}

fn graph_doc(m: &Checked, picture: &str) -> String {
    let finals: Vec<String> = (0..m.states.len())
        .filter(|&s| graph::is_final(s, &m.transitions))
        .map(|s| format!("`{}`", m.states[s].1))
        .collect();
    format!(
        "The state machine `{ident}`, drawn by `#[derive(StateMachine)]`: its states (by their \
         database names), its transitions, the initial states (the arrow from a dot) and the \
         final states ({finals}, double border).\n\n\
         {picture}\n\n\
         The value is the picture's SVG source, to save as a file (e.g. for a README).\n",
        ident = m.ident,
        finals = finals.join(", "),
    )
}

fn sql_doc(m: &Checked, statements: &[Statements], scripts: &[String]) -> String {
    let postgres = &statements[Dialect::Postgres.index()];
    let sqlite = &statements[Dialect::Sqlite.index()];
    let mysql = &statements[Dialect::MySql.index()];
    let enforce = &scripts[Dialect::Postgres.index()];
    let runs = |sql: &str| positional(sql).text.into_owned();
    let states = m
        .states
        .iter()
        .map(|(v, n)| format!("`{n}` ([`{v}`](Self::{v}))"))
        .collect::<Vec<_>>()
        .join(", ");
    let transitions = m
        .transitions
        .iter()
        .map(|&(a, b)| {
            format!(
                "`{}` → `{}`",
                m.states[a as usize].1, m.states[b as usize].1
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let key_columns = match m.key.as_slice() {
        [one] => format!("key column `{one}`"),
        many => format!(
            "key columns {}",
            many.iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let guard = format!("${}", m.key.len() + 3);
    let key_params = match m.key.len() {
        1 => "`$1` the key".to_owned(),
        n => format!("`$1` … `${n}` the key's columns"),
    };
    format!(
        "The SQL idem runs for the state machine `{ident}` (generated by `#[derive(StateMachine)]`).\n\n\
         Table `{table}`, {key_columns}, state column `{state}`, version column `{version}`; \
         first results are kept in `{results}`.\n\n\
         States: {states}.\n\n\
         Transitions: {transitions}.\n\n\
         Parameters: {key_params}, then the `from` state, the `to` state, the machine's \
         id (`{id}`, the scope of its stored results), the key as text, and the expected version last (see [`idem::Statements`]).\n\n\
         # The plain UPDATE (SQLite, and PostgreSQL while misses are rare)\n\n\
         Inside the transaction (`BEGIN IMMEDIATE` on SQLite):\n\n```sql\n{lite}\n```\n\n\
         With an expected version, `{version} = {guard}` replaces `{version} IS NOT NULL`; with \
         an event's watermark (`watermark = \"…\"`), `{version} < {guard}` does, and the row takes \
         the event's version:\n\n```sql\n{lite_watermark}\n```\n\n\
         Only when that matched no row:\n\n```sql\n{classify}\n```\n\n\
         # PostgreSQL, while most recent calls missed\n\n\
         One statement attempts the transition and, only when it matched no row, reports \
         the row and the stored first result (see [`idem::Classification`]):\n\n\
         ```sql\n{pg}\n```\n\n\
         With an expected version:\n\n```sql\n{pg_guarded}\n```\n\n\
         # PostgreSQL, a handler without a transaction\n\n\
         One autocommit statement moves the row and stores the first result (`${result}`, \
         JSON) in the same statement, or reports the row as above:\n\n```sql\n{pg_storing}\n```\n\n\
         # MySQL and MariaDB\n\n\
         The same plain UPDATE and, after a miss, the classifying read; each `$n` is bound as \
         a `?` of its own. Inside the caller's transaction the read locks (so that under \
         REPEATABLE READ it sees the row the UPDATE saw, not an older snapshot); as the first \
         read of a transaction idem began it goes without `LOCK IN SHARE MODE` \
         (`classify_unlocked`):\n\n```sql\n{my}\n```\n\n```sql\n{my_classify}\n```\n\n\
         # After the body\n\n\
         After the handler's body succeeded, if its result is not `null`:\n\n```sql\n{store}\n```\n\n\
         The results table (PostgreSQL):\n\n```sql\n{create}\n```\n\n\
         # Creating a row\n\n\
         A handler with `create = \"…\"` inserts the row in an initial state, atomically, \
         under its key (the columns of its `set(…)` join the INSERT):\n\n```sql\n{insert}\n```\n\n\
         When the key exists, this read tells a duplicate (same values) from a conflict:\n\n\
         ```sql\n{classify_created}\n```\n\n\
         # The database enforcing the machine\n\n\
         Optional: [`idem::enforce`] installs (or a migration of yours runs) a CHECK of the \
         declared states and a trigger refusing an UPDATE of `{state}` along no declared \
         transition, whoever writes the table (PostgreSQL; SQLite uses two triggers):\n\n\
         ```sql\n{enforce}\n```\n",
        ident = m.ident,
        table = m.table,
        key_columns = key_columns,
        key_params = key_params,
        guard = guard,
        state = m.state,
        version = m.version,
        results = m.results,
        id = m.id,
        pg = postgres.transition,
        pg_guarded = postgres.transition_guarded,
        pg_storing = postgres.transition_storing,
        result = m.key.len() + 5,
        lite = sqlite.transition,
        lite_watermark = sqlite.update_watermark,
        classify = sqlite.classify,
        my = runs(&mysql.transition),
        my_classify = runs(&mysql.classify),
        store = postgres.store_result,
        create = postgres.create_results_table,
        insert = postgres.create,
        classify_created = postgres.classify_created,
        enforce = enforce,
    )
}
