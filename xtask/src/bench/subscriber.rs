//! `cargo xtask bench --only subscriber`: what subscribing to conntrack's destroy events
//! costs the node, apart from the programs. The bound of the full bench (empty programs
//! on observer's three hooks and a never-read destroy subscriber) is split: empty
//! programs alone, the subscriber alone, and both, in interleaved rounds through the
//! DNAT and pod-to-pod. The subscriber's price is the points between the empty programs
//! with and without it.

use super::{
    cost,
    rounds::{self, Attached, Variant},
};

pub fn report(setup: &cost::Setup<'_>) -> anyhow::Result<()> {
    let variants = [
        Variant {
            label: "no observer",
            attached: Attached::Nothing,
        },
        Variant {
            label: "empty programs",
            attached: Attached::EmptyPrograms,
        },
        Variant {
            label: "empty programs+subscriber",
            attached: Attached::EmptyProgramsAndSubscriber,
        },
        Variant {
            label: "subscriber",
            attached: Attached::Subscriber,
        },
    ];
    let traffic: [(&str, &dyn Fn() -> anyhow::Result<crate::load::LoadReport>); 2] = [
        ("through the DNAT", setup.dnat),
        ("pod-to-pod (no Service)", setup.pod_to_pod),
    ];
    for (name, load) in traffic {
        println!("load average before: {}", rounds::load_average()?);
        let results = rounds::interleaved(setup, &variants, &|| {
            let report = load()?;
            Ok((report.rate(), report.connected))
        })?;
        println!(
            "new connections/s {name}, {} interleaved rounds",
            setup.rounds
        );
        rounds::print(&variants, &results, "connection");
        let price = |with: usize, without: usize| -> f64 {
            let mut points: Vec<f64> = results[with]
                .iter()
                .zip(&results[without])
                .zip(&results[0])
                .map(|((w, wo), base)| (wo.rate - w.rate) / base.rate * 100.0)
                .collect();
            super::median(&mut points)
        };
        println!(
            "  the subscriber's price: {:.1} points of the rate beside the empty programs, {:.1} alone (medians of per-round differences)",
            price(2, 1),
            price(3, 0)
        );
        println!("load average after: {}", rounds::load_average()?);
        println!();
    }
    Ok(())
}
