//! Reports read from records: the text and JSON summary (`summary`), CI verdicts (`check`,
//! `junit`), why a Service is skewed (`why`), `verify`'s coverage (`coverage`), the rules
//! table (`rules_table`), DNS walks (`dns`), timelines (`timeline`) and the text helpers
//! they share (`text`). Below both the live view and the command line; writes nothing.

pub mod check;
pub mod coverage;
pub mod dns;
pub mod junit;
pub mod rules_table;
pub mod summary;
pub mod text;
pub mod timeline;
pub mod why;
