//! Internal macros.

/// True when `$node` runs with mutation `$m`; constant `false` without the feature, so that the
/// broken branch is not even compiled into normal builds.
macro_rules! mutated {
    ($node:expr, $m:ident) => {{
        #[cfg(feature = "mutations")]
        let on = $node.mutation == Some(crate::mutation::Mutation::$m);
        #[cfg(not(feature = "mutations"))]
        let on = false;
        on
    }};
}

/// True when the node a [`crate::Driver`] is driving on this thread runs with mutation `$m`:
/// for code that holds no node of its own (the coordinator's pace decisions); constant `false`
/// without the feature.
macro_rules! driven_mutated {
    ($m:ident) => {{
        #[cfg(feature = "mutations")]
        let on = crate::mutation::driven() == Some(crate::mutation::Mutation::$m);
        #[cfg(not(feature = "mutations"))]
        let on = false;
        on
    }};
}
