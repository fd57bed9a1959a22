//! Plan strategies shared by the property tests of the sh rendering
//! (`props.rs`) and the PowerShell rendering (`ps_props.rs`). Each takes
//! the strategy of the raw text to build from, so each dialect stresses
//! its own syntax.

use proptest::prelude::*;

/// One path component made from `text`: no `/`, no `*`, no control
/// character, not `.` or `..`.
pub fn component(text: BoxedStrategy<String>) -> BoxedStrategy<String> {
    text.prop_map(|s| {
        s.replace(['/', '*'], "_")
            .chars()
            .filter(|c| !c.is_control())
            .collect::<String>()
    })
    .prop_filter("a real component", |c| {
        !c.is_empty() && c != "." && c != ".."
    })
    .boxed()
}

/// An absolute, normalised path of one to three components.
pub fn path(text: BoxedStrategy<String>) -> BoxedStrategy<String> {
    prop::collection::vec(component(text), 1..4)
        .prop_map(|parts| format!("/{}", parts.join("/")))
        .boxed()
}

/// A removal pattern: at least two components, up to four `*` wildcards
/// in the last one only.
pub fn pattern(text: BoxedStrategy<String>) -> BoxedStrategy<String> {
    (
        prop::collection::vec(component(text.clone()), 1..3),
        component(text),
        prop::collection::vec(any::<bool>(), 0..4),
    )
        .prop_map(|(dirs, last, stars)| {
            let mut name = last;
            for (i, star) in stars.iter().enumerate() {
                if *star {
                    let at = name.char_indices().nth(i).map_or(name.len(), |(at, _)| at);
                    name.insert(at, '*');
                }
            }
            format!("/{}/{name}", dirs.join("/"))
        })
        .boxed()
}
