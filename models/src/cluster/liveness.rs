//! Livelock freedom: from every reachable state the goal is still reachable.
//!
//! Stateright's `eventually` follows paths only until they revisit a state, so a run that
//! retransmits forever without progress looks like a cycle it never judges, and a completion
//! property asked only of quiescent states never sees it either (a retransmission timer is
//! always pending). This check builds the reachable state graph itself and searches it
//! backwards from the goal states: any reachable state from which no goal state can be reached
//! is a trap, and every run that enters it never finishes, however fair the network is. That is
//! the property `AG EF goal`; it does not say that every run finishes (a network may lose the
//! same message forever), only that no run can get stuck where finishing is impossible.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use stateright::Model;

/// What the search found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// The goal is reachable from every state explored.
    Holds,
    /// A reachable state from which the goal can no longer be reached, and the steps to it.
    Trapped(Vec<String>),
    /// The state space is larger than the limit; nothing was concluded.
    TooLarge,
}

fn fingerprint<T: Hash>(value: &T) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// The state graph: one node per distinct state (by fingerprint), its parent on a shortest path
/// from an initial state, whether it satisfies the goal, and the edges.
struct Graph {
    index: HashMap<u64, u32>,
    fingerprints: Vec<u64>,
    parent: Vec<u32>,
    goal: Vec<bool>,
    edges: Vec<(u32, u32)>,
}

impl Graph {
    fn add(&mut self, fp: u64, parent: u32, goal: bool) -> (u32, bool) {
        if let Some(&i) = self.index.get(&fp) {
            return (i, false);
        }
        let i = self.fingerprints.len() as u32;
        self.index.insert(fp, i);
        self.fingerprints.push(fp);
        self.parent.push(parent);
        self.goal.push(goal);
        (i, true)
    }

    /// Nodes from which some goal node is reachable.
    fn can_reach_goal(&self) -> Vec<bool> {
        let n = self.fingerprints.len();
        let mut incoming: Vec<Vec<u32>> = vec![Vec::new(); n];
        for &(from, to) in &self.edges {
            incoming[to as usize].push(from);
        }
        let mut reached = self.goal.clone();
        let mut stack: Vec<u32> = (0..n as u32).filter(|&i| reached[i as usize]).collect();
        while let Some(i) = stack.pop() {
            for &p in &incoming[i as usize] {
                if !reached[p as usize] {
                    reached[p as usize] = true;
                    stack.push(p);
                }
            }
        }
        reached
    }
}

/// Checks `AG EF goal` on `model` breadth first, giving up beyond `max_states` distinct states.
/// States outside the model's boundary count as goal states: they are not explored, so nothing
/// is claimed about them. A trap is reported with the shortest path to the first trapped state
/// found, each step described by `describe`.
pub fn check_livelock<M>(
    model: &M,
    goal: fn(&M, &M::State) -> bool,
    max_states: usize,
    describe: fn(&M::Action) -> String,
) -> Liveness
where
    M: Model,
    M::State: Hash,
{
    let mut graph = Graph {
        index: HashMap::new(),
        fingerprints: Vec::new(),
        parent: Vec::new(),
        goal: Vec::new(),
        edges: Vec::new(),
    };
    let mut queue = std::collections::VecDeque::new();
    for state in model.init_states() {
        let fp = fingerprint(&state);
        let goal = goal(model, &state) || !model.within_boundary(&state);
        let (i, new) = graph.add(fp, u32::MAX, goal);
        if new {
            queue.push_back((i, state));
        }
    }
    let mut actions = Vec::new();
    while let Some((i, state)) = queue.pop_front() {
        if graph.fingerprints.len() > max_states {
            return Liveness::TooLarge;
        }
        if !model.within_boundary(&state) {
            continue;
        }
        actions.clear();
        model.actions(&state, &mut actions);
        for action in actions.drain(..) {
            let Some(next) = model.next_state(&state, action) else {
                continue;
            };
            let fp = fingerprint(&next);
            let is_goal = goal(model, &next) || !model.within_boundary(&next);
            let (j, new) = graph.add(fp, i, is_goal);
            graph.edges.push((i, j));
            if new {
                queue.push_back((j, next));
            }
        }
    }
    let reached = graph.can_reach_goal();
    if reached.iter().all(|&r| r) {
        return Liveness::Holds;
    }
    // Nodes are numbered in breadth-first order. The most telling trapped state is the first
    // one entered from a state that could still finish (the step that made finishing
    // impossible); when the very start is trapped, the deepest one shows how far a run gets.
    let trapped = |i: usize| !reached[i];
    let entered = (0..reached.len()).find(|&i| {
        let parent = graph.parent[i];
        trapped(i) && parent != u32::MAX && !trapped(parent as usize)
    });
    let node = entered.or_else(|| (0..reached.len()).rev().find(|&i| trapped(i)));
    let steps = node.map_or_else(Vec::new, |n| path_to(model, &graph, n as u32, describe));
    Liveness::Trapped(steps)
}

/// Replays the parent chain of `node` from its initial state, finding at each step the action
/// that leads to the next fingerprint.
fn path_to<M>(
    model: &M,
    graph: &Graph,
    node: u32,
    describe: fn(&M::Action) -> String,
) -> Vec<String>
where
    M: Model,
    M::State: Hash,
{
    let mut chain = vec![graph.fingerprints[node as usize]];
    let mut at = node;
    while graph.parent[at as usize] != u32::MAX {
        at = graph.parent[at as usize];
        chain.push(graph.fingerprints[at as usize]);
    }
    chain.reverse();
    let Some(mut state) = model
        .init_states()
        .into_iter()
        .find(|s| fingerprint(s) == chain[0])
    else {
        return Vec::new();
    };
    let mut steps = Vec::new();
    let mut actions = Vec::new();
    for &want in &chain[1..] {
        actions.clear();
        model.actions(&state, &mut actions);
        let next = actions.drain(..).find_map(|a| {
            let text = describe(&a);
            model
                .next_state(&state, a)
                .filter(|n| fingerprint(n) == want)
                .map(|n| (text, n))
        });
        let Some((text, next)) = next else {
            steps.push("(the path could not be rebuilt from here)".into());
            break;
        };
        steps.push(text);
        state = next;
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter that may step up to 3 (the goal) from 0 and 1; from 2 it can only stay.
    struct Counter;

    impl Model for Counter {
        type State = u8;
        type Action = u8;

        fn init_states(&self) -> Vec<u8> {
            vec![0]
        }

        fn actions(&self, state: &u8, actions: &mut Vec<u8>) {
            match state {
                0 => actions.extend([1, 2]),
                1 => actions.push(3),
                2 => actions.push(2),
                _ => {}
            }
        }

        fn next_state(&self, _: &u8, action: u8) -> Option<u8> {
            Some(action)
        }
    }

    #[test]
    fn a_state_that_can_only_loop_is_a_trap_and_its_path_is_given() {
        let result = check_livelock(&Counter, |_, s| *s == 3, 100, |a| format!("to {a}"));
        assert_eq!(result, Liveness::Trapped(vec!["to 2".into()]));
    }

    #[test]
    fn a_graph_where_every_state_reaches_the_goal_holds() {
        let result = check_livelock(&Counter, |_, s| *s >= 2, 100, |a| format!("to {a}"));
        assert_eq!(result, Liveness::Holds);
        let result = check_livelock(&Counter, |_, s| *s == 3, 2, |a| format!("to {a}"));
        assert_eq!(result, Liveness::TooLarge);
    }
}
