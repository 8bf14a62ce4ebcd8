//! conntrack's warning line above the tables: when it says what, and how it is drawn.

use super::snapshots::{assert_snapshot, screen};
use super::*;
use crate::model::record::CtStats;
use crate::model::update::ConntrackReading;

const NODE: u32 = 4026532301;

fn table(entries: u32, max_entries: u32, drop: u64, early_drop: u64) -> CtStats {
    CtStats {
        entries,
        max_entries,
        insert_failed: 0,
        drop,
        early_drop,
    }
}

/// A reading of `netns` taken `ms` after t0.
fn reading(app: &mut App, netns: u32, ms: i64, stats: CtStats) {
    let reading = Some(ConntrackReading {
        time: at(ms),
        stats,
    });
    live(app, Update::Conntrack { netns, reading });
}

fn warning(app: &App) -> Option<String> {
    app.pressure.warning()
}

#[test]
fn a_table_over_80_percent_full_is_warned_about() {
    let mut app = new_app();
    reading(&mut app, NODE, 0, table(52_428, 65_536, 0, 0));
    assert_eq!(warning(&app), None, "exactly 80% is not over it");
    reading(&mut app, NODE, 5000, table(54_395, 65_536, 0, 0));
    assert_eq!(
        warning(&app).as_deref(),
        Some("! conntrack in netns 4026532301: 83% full (54,395/65,536)")
    );
    // No limit (nf_conntrack_max 0): never full.
    reading(&mut app, NODE, 10_000, table(54_395, 0, 0, 0));
    assert_eq!(warning(&app), None);
}

#[test]
fn refusals_since_the_previous_reading_are_warned_about_until_the_next() {
    let mut app = new_app();
    // The first reading of a namespace has nothing to compare with.
    reading(&mut app, NODE, 0, table(1000, 65_536, 4, 30));
    assert_eq!(warning(&app), None);
    reading(&mut app, NODE, 5020, table(1000, 65_536, 4, 42));
    assert_eq!(
        warning(&app).as_deref(),
        Some("! conntrack in netns 4026532301: 12 early drops in 5 s")
    );
    let mut failed = table(54_395, 65_536, 5, 42);
    failed.insert_failed = 2;
    reading(&mut app, NODE, 10_000, failed);
    assert_eq!(
        warning(&app).as_deref(),
        Some(
            "! conntrack in netns 4026532301: 83% full (54,395/65,536), 1 drop, 2 failed inserts in 5 s"
        )
    );
    failed.entries = 1000;
    reading(&mut app, NODE, 15_000, failed);
    assert_eq!(warning(&app), None, "nothing rose since");
}

#[test]
fn the_worst_namespace_is_named_and_the_others_counted() {
    let mut app = new_app();
    for netns in [NODE, NODE + 1, NODE + 2] {
        reading(&mut app, netns, 0, table(100, 1000, 0, 0));
    }
    reading(&mut app, NODE, 5000, table(900, 1000, 0, 0));
    reading(&mut app, NODE + 1, 5000, table(990, 1000, 0, 0));
    reading(&mut app, NODE + 2, 5000, table(100, 1000, 0, 0));
    assert_eq!(
        warning(&app).as_deref(),
        Some("! conntrack in netns 4026532302: 99% full (990/1,000) (and 1 other namespace)")
    );
    // Drops outweigh a fuller table.
    reading(&mut app, NODE + 2, 10_000, table(100, 1000, 3, 0));
    assert_eq!(
        warning(&app).as_deref(),
        Some("! conntrack in netns 4026532303: 3 drops in 5 s (and 2 other namespaces)")
    );
    // A namespace no longer read says nothing more.
    live(
        &mut app,
        Update::Conntrack {
            netns: NODE + 2,
            reading: None,
        },
    );
    live(
        &mut app,
        Update::Conntrack {
            netns: NODE + 1,
            reading: None,
        },
    );
    assert_eq!(
        warning(&app).as_deref(),
        Some("! conntrack in netns 4026532301: 90% full (900/1,000)")
    );
}

#[test]
fn snapshot_conntrack_warning() {
    let mut app = steady();
    reading(&mut app, NODE, 0, table(50_000, 65_536, 0, 30));
    reading(&mut app, NODE, 5000, table(54_395, 65_536, 0, 42));
    tick(&mut app, 6000);
    assert_snapshot("conntrack_warning", &screen(&app, 80, 24));
    // Narrower than the line: cut with an ellipsis, never wrapped.
    assert_snapshot("conntrack_warning_narrow", &screen(&app, 60, 24));
}
