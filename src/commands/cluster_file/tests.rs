use super::*;
use pserver_core::filter::KeyCaching;

const GOOD: &str = r#"
cluster_id = "t"
consistency = "bounded:2"
secret_file = "s.key"
[job]
keys = 10
iterations = 3
[[node]]
id = 0
role = "coordinator"
address = "127.0.0.1:7400"
[[node]]
id = 1
role = "server"
address = "127.0.0.1:7401"
[[node]]
id = 2
role = "worker"
address = "127.0.0.1:7402"
"#;

fn parse(text: &str) -> Result<ClusterFile, ClusterFileError> {
    ClusterFile::parse(Path::new("/etc/pserver/c.toml"), text)
}

#[test]
fn a_good_file_gives_the_job_and_every_address() {
    let f = parse(GOOD).unwrap();
    assert_eq!(f.spec.job.consistency, Consistency::BoundedDelay(2));
    assert_eq!((f.spec.job.servers, f.spec.job.workers), (1, 1));
    assert_eq!(f.script.iterations, 3);
    assert_eq!(f.addresses.len(), 3);
    assert_eq!(f.secret_file, Some(PathBuf::from("/etc/pserver/s.key")));
}

#[test]
fn the_transport_is_tcp_by_default_udp_on_request_and_nothing_else() {
    assert_eq!(parse(GOOD).unwrap().transport, ProcessWire::Tcp);
    let udp = GOOD.replace(
        "cluster_id = \"t\"",
        "cluster_id = \"t\"\ntransport = \"udp\"",
    );
    let f = parse(&udp).unwrap();
    assert_eq!(f.transport, ProcessWire::Udp);
    let mem = GOOD.replace(
        "cluster_id = \"t\"",
        "cluster_id = \"t\"\ntransport = \"mem\"",
    );
    let e = parse(&mem).unwrap_err().to_string();
    assert!(
        e.starts_with("/etc/pserver/c.toml: transport: `mem`") && e.contains("\"udp\""),
        "{e}"
    );
}

#[test]
fn errors_name_the_file_and_the_field() {
    let bad_role = GOOD.replace("\"server\"", "\"sever\"");
    let e = parse(&bad_role).unwrap_err().to_string();
    assert!(
        e.starts_with("/etc/pserver/c.toml: node[1].role: `sever`"),
        "{e}"
    );
    let bad_addr = GOOD.replace("127.0.0.1:7402", "localhost");
    let e = parse(&bad_addr).unwrap_err().to_string();
    assert!(e.contains("node[2].address"), "{e}");
    let bad_consistency = GOOD.replace("bounded:2", "bounded");
    let e = parse(&bad_consistency).unwrap_err().to_string();
    assert!(e.contains("c.toml: consistency:"), "{e}");
    let e = parse("cluster_id = 3").unwrap_err().to_string();
    assert!(e.contains("c.toml:") && e.contains("line 1"), "{e}");
    let swapped = GOOD.replace("id = 1", "id = 9");
    let e = parse(&swapped).unwrap_err().to_string();
    assert!(e.contains("node ids must be"), "{e}");
    let bad_app = GOOD.replace("keys = 10", "app = \"nn\"\nkeys = 10");
    let e = parse(&bad_app).unwrap_err().to_string();
    assert!(e.starts_with("/etc/pserver/c.toml: job.app: `nn`"), "{e}");
    let not_a_name = GOOD.replace("\"worker\"", "3");
    let e = parse(&not_a_name).unwrap_err().to_string();
    assert!(
        e.contains("line 18") && e.contains("expected a string"),
        "{e}"
    );
}

#[test]
fn a_job_runs_the_script_unless_it_names_lr() {
    assert_eq!(parse(GOOD).unwrap().job, Job::Script);
    let lr = GOOD.replace("keys = 10", "app = \"lr\"\ndata = \"t.svm\"\nkeys = 10");
    let Job::Lr(job) = parse(&lr).unwrap().job else {
        panic!("not an lr job");
    };
    assert_eq!(job.data, PathBuf::from("/etc/pserver/t.svm"));
}

/// An lr job with `field = value` added to its `[job]` table.
fn lr_job_with(field: &str, value: &str) -> String {
    GOOD.replace(
        "keys = 10",
        &format!("app = \"lr\"\ndata = \"t.svm\"\n{field} = {value}\nkeys = 10"),
    )
}

#[test]
fn an_lr_job_names_the_label_of_its_positive_rows_or_reads_labels_as_binary() {
    let labels = |lines: &str| {
        let text = GOOD.replace(
            "keys = 10",
            &format!("app = \"lr\"\ndata = \"t.svm\"\n{lines}\nkeys = 10"),
        );
        match parse(&text).map(|f| f.job) {
            Ok(Job::Lr(job)) => Ok(job.labels),
            Ok(_) => panic!("not an lr job"),
            Err(e) => Err(e.to_string()),
        }
    };
    assert_eq!(labels(""), Ok(Labels::Binary));
    assert_eq!(labels("positive = 3"), Ok(Labels::Positive(3.0)));
    assert_eq!(labels("positive = -1.5"), Ok(Labels::Positive(-1.5)));
    let e = labels("positive = nan").unwrap_err();
    assert!(e.starts_with("/etc/pserver/c.toml: job.positive: "), "{e}");
}

#[test]
fn an_lr_job_streams_its_file_in_windows_only_when_told_to() {
    let window = |app: &str, lines: &str| {
        let text = GOOD.replace(
            "keys = 10",
            &format!("app = \"{app}\"\ndata = \"t.svm\"\n{lines}\nkeys = 10"),
        );
        match parse(&text).map(|f| f.job) {
            Ok(Job::Lr(job)) => Ok(job.window),
            Ok(_) => Err("not an lr job".to_owned()),
            Err(e) => Err(e.to_string()),
        }
    };
    assert_eq!(window("lr", ""), Ok(None));
    assert_eq!(window("lr", "stream = true"), Ok(Some(20_000)));
    assert_eq!(window("lr", "stream = true\nwindow = 500"), Ok(Some(500)));
    for (app, lines, field) in [
        ("lr", "window = 500", "job.window"),
        ("lr", "stream = true\nwindow = 0", "job.window"),
        ("mf", "stream = true", "job.stream"),
    ] {
        let e = window(app, lines).unwrap_err();
        assert!(
            e.starts_with(&format!("/etc/pserver/c.toml: {field}: ")),
            "{lines}: {e}"
        );
    }
}

#[test]
fn an_lr_job_holds_rows_out_to_choose_the_epoch_it_saves_unless_told_not_to() {
    let validation = |lines: &str| {
        let text = GOOD.replace(
            "keys = 10",
            &format!("app = \"lr\"\ndata = \"t.svm\"\n{lines}\nkeys = 10"),
        );
        match parse(&text).map(|f| f.job) {
            Ok(Job::Lr(job)) => Ok(job.cfg.validation),
            Ok(_) => panic!("not an lr job"),
            Err(e) => Err(e.to_string()),
        }
    };
    // A tenth by default where an epoch is chosen among several to save.
    assert_eq!(validation("save = \"m.bin\""), Ok(Some(0.1)));
    assert_eq!(validation("save = \"m.bin\"\nepochs = 1"), Ok(None));
    assert_eq!(validation(""), Ok(None));
    assert_eq!(
        validation("save = \"m.bin\"\nvalidation_fraction = 0.25"),
        Ok(Some(0.25))
    );
    // 0: every row trained.
    assert_eq!(
        validation("save = \"m.bin\"\nvalidation_fraction = 0"),
        Ok(None)
    );
    for bad in ["1", "-0.1", "nan"] {
        let e = validation(&format!("validation_fraction = {bad}")).unwrap_err();
        assert!(
            e.starts_with("/etc/pserver/c.toml: job.validation_fraction: "),
            "{bad}: {e}"
        );
    }
}

#[test]
fn a_cluster_file_with_a_zero_batch_is_refused_naming_the_field() {
    let e = parse(&lr_job_with("batch", "0")).unwrap_err().to_string();
    assert_eq!(e, "/etc/pserver/c.toml: job.batch: must be at least 1");
}

#[test]
fn a_cluster_file_with_zero_epochs_or_iterations_is_refused_naming_the_field() {
    let e = parse(&lr_job_with("epochs", "0")).unwrap_err().to_string();
    assert_eq!(e, "/etc/pserver/c.toml: job.epochs: must be at least 1");
    let e = parse(&GOOD.replace("iterations = 3", "iterations = 0"))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "/etc/pserver/c.toml: job.iterations: must be at least 1");
}

#[test]
fn a_cluster_file_with_a_nan_zero_or_infinite_alpha_is_refused_naming_the_field() {
    for bad in ["nan", "0.0", "-0.3", "inf"] {
        let e = parse(&lr_job_with("alpha", bad)).unwrap_err().to_string();
        assert!(
            e.starts_with("/etc/pserver/c.toml: job.alpha: ")
                && e.ends_with("is not a finite number above 0"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn a_cluster_file_with_a_negative_or_nan_regularization_is_refused_naming_the_field() {
    for field in ["l1", "l2"] {
        for bad in ["-5.0", "nan", "inf"] {
            let e = parse(&lr_job_with(field, bad)).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("/etc/pserver/c.toml: job.{field}: ")),
                "{field} = {bad}: {e}"
            );
        }
        assert!(parse(&lr_job_with(field, "0.0")).is_ok(), "{field} = 0");
    }
}

#[test]
fn a_cluster_file_with_a_good_lr_job_keeps_its_batch_and_rates() {
    let Job::Lr(job) = parse(&lr_job_with("batch", "7")).unwrap().job else {
        panic!("not an lr job");
    };
    assert_eq!(job.cfg.batch, 7);
    assert_eq!(
        job.cfg.job.updater,
        Updater::FtrlProximal {
            alpha: 0.1,
            beta: 1.0,
            l1: 1.0,
            l2: 1.0
        }
    );
}

#[test]
fn an_lr_job_chooses_its_update_rule_and_refuses_a_rate_the_rule_does_not_use() {
    let sgd = lr_job_with("updater", "\"sgd\"").replace("keys = 10", "lr = 0.5\nkeys = 10");
    let Job::Lr(job) = parse(&sgd).unwrap().job else {
        panic!("not an lr job");
    };
    assert_eq!(job.cfg.job.updater, Updater::Sgd { lr: 0.5 });
    let f = parse(&lr_job_with("updater", "\"adagrad\"")).unwrap();
    assert_eq!(f.spec.job.updater, Updater::AdaGrad { lr: 0.1, eps: 1e-6 });
    let e = parse(&sgd.replace("lr = 0.5", "alpha = 1.0"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("/etc/pserver/c.toml: job.alpha: not used by updater \"sgd\""),
        "{e}"
    );
    let e = parse(&lr_job_with("lr", "0.1")).unwrap_err().to_string();
    assert!(
        e.starts_with("/etc/pserver/c.toml: job.lr: not used"),
        "{e}"
    );
    let e = parse(&lr_job_with("updater", "\"adam\""))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("/etc/pserver/c.toml: job.updater: `adam`"),
        "{e}"
    );
}

#[test]
fn an_lr_job_has_an_unregularized_intercept_and_one_index_base_unless_told_otherwise() {
    let f = parse(&lr_job_with("batch", "7")).unwrap();
    let Job::Lr(job) = &f.job else {
        panic!("not an lr job");
    };
    assert!(job.cfg.bias && job.index_base == IndexBase::Auto);
    // The servers, built from the file's spec, know the intercept's key.
    let intercept = pserver_core::KeyRange::single(crate::apps::lr::BIAS_KEY).ok();
    assert_eq!(f.spec.job.unregularized, intercept);
    // They keep rows in the hashed layout, and hold the pulls the pipelined workers send a
    // step ahead to a bound one lower than the job's.
    assert_eq!(f.spec.job.store, pserver_core::store::StoreLayout::Hashed);
    assert!(job.cfg.pipelined());
    assert_eq!(f.spec.job.consistency, job.cfg.protocol_job().consistency);
    if let pserver_core::Consistency::BoundedDelay(tau) = job.cfg.job.consistency {
        assert_eq!(
            f.spec.job.consistency,
            pserver_core::Consistency::BoundedDelay(tau - 1)
        );
    }
    let f = parse(&lr_job_with("bias", "false")).unwrap();
    assert_eq!(f.spec.job.unregularized, None);
    for (value, base) in [
        ("0", IndexBase::Zero),
        ("1", IndexBase::One),
        ("\"auto\"", IndexBase::Auto),
    ] {
        let Job::Lr(job) = parse(&lr_job_with("index_base", value)).unwrap().job else {
            panic!("not an lr job");
        };
        assert_eq!(job.index_base, base, "{value}");
    }
    let e = parse(&lr_job_with("index_base", "2"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("/etc/pserver/c.toml: job.index_base: 2 is not"),
        "{e}"
    );
}

#[test]
fn a_ring_may_declare_the_jobs_key_space_but_not_an_empty_one() {
    assert_eq!(parse(GOOD).unwrap().spec.job.ring.key_space, u64::MAX);
    let with = |k: &str| GOOD.replace("[job]", &format!("[ring]\nkey_space = {k}\n[job]"));
    assert_eq!(
        parse(&with("1048576")).unwrap().spec.job.ring.key_space,
        1 << 20
    );
    let e = parse(&with("0")).unwrap_err().to_string();
    assert!(
        e.starts_with("/etc/pserver/c.toml: ring.key_space: "),
        "{e}"
    );
}

#[test]
fn a_port_zero_address_is_refused_by_name() {
    let any_port = GOOD.replace("127.0.0.1:7401", "127.0.0.1:0");
    let e = parse(&any_port).unwrap_err().to_string();
    assert!(
        e.starts_with("/etc/pserver/c.toml: node[1].address: `127.0.0.1:0` has port 0"),
        "{e}"
    );
}

#[test]
fn the_largest_replica_count_is_refused_without_wrapping_around() {
    let most = format!("{GOOD}[ring]\nreplicas = {}\n", u32::MAX);
    let e = parse(&most).unwrap_err().to_string();
    assert!(
        e.contains("4294967295 replicas need at least 4294967296 servers, but the file names 1"),
        "{e}"
    );
}

#[test]
fn a_job_refuses_loss_unless_it_says_it_allows_it() {
    assert!(!parse(GOOD).unwrap().allow_loss);
    let allowing = GOOD.replace("keys = 10", "keys = 10\nallow_loss = true");
    assert!(parse(&allowing).unwrap().allow_loss);
}

#[test]
fn a_worker_gives_up_after_the_stall_limit_the_job_sets() {
    let limit = |text: &str| parse(text).unwrap().spec.runtime.stall_limit;
    assert_eq!(limit(GOOD), Some(Duration::from_secs(300)));
    let short = GOOD.replace("keys = 10", "keys = 10\nstall_limit_secs = 5");
    assert_eq!(limit(&short), Some(Duration::from_secs(5)));
    let never = GOOD.replace("keys = 10", "keys = 10\nstall_limit_secs = 0");
    assert_eq!(limit(&never), None);
}

/// `text` with a `[filters]` table of `lines`.
fn with_filters(text: &str, lines: &str) -> String {
    text.replace(
        "[[node]]\nid = 0",
        &format!("[filters]\n{lines}\n[[node]]\nid = 0"),
    )
}

#[test]
fn a_job_runs_no_filters_unless_its_filters_table_names_them() {
    let f = parse(GOOD).unwrap();
    assert_eq!(f.spec.job.filters, Filters::none());
    let text = with_filters(
        &lr_job_with("l1", "0.25"),
        "key_cache = 64\ncompress = true\nsigmod = 0.05\nkkt = 300",
    );
    let f = parse(&text).unwrap();
    let filters = f.spec.job.filters;
    assert_eq!(filters.key_caching, KeyCaching::new(64));
    assert!(filters.compression);
    assert_eq!(filters.significantly_modified, Threshold::new(0.05));
    let kkt = filters.kkt.unwrap();
    assert_eq!((kkt.bound().get(), kkt.every()), (0.25, 300));
    let Job::Lr(job) = f.job else {
        panic!("not an lr job");
    };
    assert_eq!(job.cfg.job.filters, filters);
}

#[test]
fn a_filter_setting_it_cannot_mean_is_refused_naming_the_field() {
    let refused = |text: &str| parse(text).unwrap_err().to_string();
    let cases = [
        (
            with_filters(GOOD, "sigmod = -1.0"),
            "filters.sigmod: -1 is not a finite number of at least 0",
        ),
        (
            with_filters(GOOD, "key_cache = 0"),
            "filters.key_cache: 0 is not a whole number of lists of at least 1",
        ),
        (
            with_filters(GOOD, "compress = true"),
            "filters.compress: compresses what key caching sends without keys: give filters.key_cache too",
        ),
        (
            with_filters(GOOD, "kkt = 10"),
            "filters.kkt: needs an L1-regularised model: an lr job (job.app = \"lr\")",
        ),
        (
            with_filters(&lr_job_with("l1", "0.0"), "kkt = 10"),
            "filters.kkt: needs job.l1 above 0, not 0",
        ),
        (
            with_filters(&lr_job_with("l1", "0.1"), "kkt = 0"),
            "filters.kkt: 0 is not a whole number of pushes of at least 1",
        ),
    ];
    for (text, said) in cases {
        let e = refused(&text);
        assert!(e.starts_with("/etc/pserver/c.toml: "), "{e}");
        assert!(e.ends_with(said), "{e}");
    }
    let unknown = refused(&with_filters(GOOD, "zip = true"));
    assert!(unknown.contains("unknown field `zip`"), "{unknown}");
    let sgd = lr_job_with("updater", "\"sgd\"").replace("keys = 10", "lr = 0.5\nkeys = 10");
    assert!(
        refused(&with_filters(&sgd, "kkt = 10"))
            .ends_with("needs an L1-regularised model: job.updater \"ftrl\""),
    );
}

#[test]
fn two_nodes_with_one_address_are_refused_naming_both() {
    let text = GOOD.replace("127.0.0.1:7402", "127.0.0.1:7401");
    let e = parse(&text).unwrap_err().to_string();
    assert_eq!(
        e,
        "/etc/pserver/c.toml: node[2].address: 127.0.0.1:7401 is also the address of node n1"
    );
    // The same port on two hosts is two addresses.
    assert!(parse(&GOOD.replace("127.0.0.1:7402", "127.0.0.2:7401")).is_ok());
}

const PATTERNED: &str = r#"
cluster_id = "t"
secret_file = "s.key"
[[node]]
role = "worker"
count = 2
address = "pserver-worker-{i}.pserver-worker:7400"
[[node]]
role = "coordinator"
address = "pserver-coordinator:7400"
[[node]]
role = "server"
count = 3
address = "pserver-server-{i}.pserver-server:7400"
"#;

#[test]
fn nodes_may_be_named_by_role_count_and_pattern_and_are_numbered_as_the_layout_does() {
    let f = parse(PATTERNED).unwrap();
    assert_eq!((f.spec.job.servers, f.spec.job.workers), (3, 2));
    let shown: Vec<String> = f.addresses.values().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "pserver-coordinator:7400",
            "pserver-server-0.pserver-server:7400",
            "pserver-server-1.pserver-server:7400",
            "pserver-server-2.pserver-server:7400",
            "pserver-worker-0.pserver-worker:7400",
            "pserver-worker-1.pserver-worker:7400",
        ]
    );
    assert_eq!(f.role(NodeId(3)).unwrap(), Role::Server);
    assert_eq!(f.role(NodeId(4)).unwrap(), Role::Worker);
    // A node given by name listens on every interface at its port.
    assert_eq!(f.addresses[&NodeId(2)].listen().to_string(), "0.0.0.0:7400");
}

#[test]
fn a_pattern_without_a_count_or_a_count_without_a_pattern_is_refused() {
    let cases = [
        (
            "count = 3\naddress = \"pserver-server-{i}",
            "address = \"pserver-server-{i}",
            "has {i} but no count",
        ),
        (
            "count = 3\naddress = \"pserver-server-{i}.pserver-server:7400\"",
            "count = 3\naddress = \"pserver-server.pserver-server:7400\"",
            "one address for 3 nodes",
        ),
        (
            "count = 3\n",
            "count = 0\n",
            "node[2].count: must be at least 1",
        ),
        (
            "role = \"coordinator\"\n",
            "role = \"coordinator\"\nid = 0\n",
            "1 of 3 [[node]] entries have an id",
        ),
        (
            "pserver-server-{i}.pserver-server:7400",
            "pserver-server-{i}.pserver-server",
            "node[2].address ({i} = 0): `pserver-server-0.pserver-server` is not an address",
        ),
        (
            "count = 3\naddress = \"pserver-server-{i}.pserver-server:7400\"",
            "address = \"pserver-coordinator:7400\"",
            "pserver-coordinator:7400 is also the address of node n0",
        ),
    ];
    for (from, to, said) in cases {
        let text = PATTERNED.replacen(from, to, 1);
        assert_ne!(text, PATTERNED, "{from}");
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains(said), "{to}: {e}");
    }
}

#[test]
fn host_names_are_compared_without_regard_to_case() {
    let text = PATTERNED.replace(
        "pserver-coordinator:7400",
        "PSERVER-WORKER-1.pserver-worker:7400",
    );
    let e = parse(&text).unwrap_err().to_string();
    assert!(e.contains("is also the address of node n0"), "{e}");
}

/// The cluster file the Kubernetes manifests mount, read as every pod reads it.
#[test]
fn the_kubernetes_cluster_file_is_one_pserver_accepts() {
    let manifest = include_str!("../../../deploy/kubernetes/configmap.yaml");
    let (_, block) = manifest
        .split_once("cluster.toml: |\n")
        .expect("a cluster.toml literal block");
    let text: String = block
        .lines()
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    let f = parse(&text).unwrap();
    assert!(f.addresses.values().all(|a| a.host().is_some()), "{text}");
    assert!(matches!(f.job, Job::Lr(_)));
    // The standby's Deployment (coordinator-standby.yaml) runs `--id 5`.
    assert_eq!(f.spec.job.standbys.to_vec(), vec![NodeId(5)]);
}

#[test]
fn an_mf_job_takes_its_rank_and_rates_and_refuses_what_it_does_not_use() {
    let mf = |lines: &str| {
        GOOD.replace(
            "[job]\n",
            &format!("[job]\napp = \"mf\"\ndata = \"u.data\"\n{lines}\n"),
        )
    };
    let f = parse(&mf(
        "rank = 3\nlr = 0.2\nl2 = 0.5\nepochs = 9\nbatch = 7\nseed = 11",
    ))
    .unwrap();
    let Job::Mf(job) = &f.job else {
        panic!("{:?}", f.job)
    };
    assert_eq!(job.data, PathBuf::from("/etc/pserver/u.data"));
    assert_eq!(
        (
            job.cfg.rank,
            job.cfg.lr,
            job.cfg.l2,
            job.cfg.epochs,
            job.cfg.batch,
            job.cfg.seed
        ),
        (3, 0.2, 0.5, 9, 7, 11)
    );
    assert_eq!(job.test_fraction, 0.1);
    // The servers hold rows of rank factors and a bias, updated by SGD at the job's rate.
    assert_eq!(f.spec.job.width, 4);
    assert_eq!(f.spec.job.updater, Updater::Sgd { lr: 0.2 });
    let defaults = parse(&mf("")).unwrap();
    let Job::Mf(job) = &defaults.job else {
        panic!()
    };
    assert_eq!((job.cfg.rank, job.cfg.lr, job.cfg.l2), (10, 0.05, 0.05));
    for (lines, said) in [
        (
            "updater = \"ftrl\"",
            "job.updater: an mf job trains with \"sgd\"",
        ),
        ("alpha = 1", "job.alpha: not used by an mf job"),
        ("l1 = 1", "job.l1: not used by an mf job"),
        (
            "validation_fraction = 0.2",
            "job.validation_fraction: not used by an mf job",
        ),
        ("positive = 2", "job.positive: not used by an mf job"),
        ("rank = 0", "job.rank: 0 is not a rank"),
        ("lr = -1", "job.lr"),
        ("test_fraction = 1.0", "job.test_fraction"),
        (
            "test = \"t.data\"\ntest_fraction = 0.2",
            "give one or the other",
        ),
        (
            "checkpoint_every = 10",
            "job.checkpoint_every: an mf job cannot resume from whole-job checkpoints yet",
        ),
    ] {
        let e = parse(&mf(lines)).unwrap_err().to_string();
        assert!(e.contains(said), "{lines}: {e}");
    }
    assert!(parse(&mf("updater = \"sgd\"")).is_ok());
    // It saves its model and starts from one, as an lr job does.
    let Job::Mf(job) = parse(&mf("save = \"m.mf\"\ninit = \"old.mf\""))
        .unwrap()
        .job
    else {
        panic!("an mf job");
    };
    assert_eq!(job.save.as_deref(), Some(Path::new("/etc/pserver/m.mf")));
    assert_eq!(job.init.as_deref(), Some(Path::new("/etc/pserver/old.mf")));
    // And an lr job refuses what only mf takes.
    let lr = GOOD.replace(
        "[job]\n",
        "[job]\napp = \"lr\"\ndata = \"d.svm\"\nrank = 4\n",
    );
    let e = parse(&lr).unwrap_err().to_string();
    assert!(e.contains("job.rank: only an mf job"), "{e}");
}

/// Every whole cluster file the front page and the operators' guide show (a TOML block with
/// a `cluster_id`) is one pserver accepts.
#[test]
fn every_cluster_file_in_the_readme_and_the_operators_guide_is_one_pserver_accepts() {
    let mut checked = 0;
    for (name, text) in [
        ("README.md", include_str!("../../../README.md")),
        (
            "docs/operating.md",
            include_str!("../../../docs/operating.md"),
        ),
    ] {
        for block in text.split("```toml\n").skip(1) {
            let block = block.split("```").next().unwrap_or_default();
            if !block.contains("cluster_id") {
                continue;
            }
            if let Err(e) = parse(block) {
                panic!("{name}: a cluster file it shows is refused: {e}\n{block}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 2, "{checked} cluster files found");
}

#[test]
fn checkpoint_every_is_read_into_the_job_and_an_lr_job_s_copy_of_it() {
    assert_eq!(parse(GOOD).unwrap().spec.job.checkpoint_every, 0);
    let every = GOOD.replace("[job]\n", "[job]\ncheckpoint_every = 25\n");
    assert_eq!(parse(&every).unwrap().spec.job.checkpoint_every, 25);
    let lr = GOOD.replace(
        "[job]\nkeys = 10\niterations = 3\n",
        "[job]\napp = \"lr\"\ndata = \"a.svm\"\ncheckpoint_every = 7\n",
    );
    let f = parse(&lr).unwrap();
    let Job::Lr(job) = &f.job else {
        panic!("{:?}", f.job)
    };
    assert_eq!(
        (f.spec.job.checkpoint_every, job.cfg.job.checkpoint_every),
        (7, 7)
    );
}

#[test]
fn min_replicas_is_read_and_may_not_exceed_the_replicas() {
    let two_servers = GOOD.replace(
        "id = 2\nrole = \"worker\"\naddress = \"127.0.0.1:7402\"",
        "id = 2\nrole = \"server\"\naddress = \"127.0.0.1:7402\"\n[[node]]\nid = 3\nrole = \"worker\"\naddress = \"127.0.0.1:7403\"",
    );
    assert_eq!(parse(&two_servers).unwrap().spec.job.min_replicas, 0);
    let keeping = format!("{two_servers}[ring]\nmin_replicas = 1\n");
    let f = parse(&keeping).unwrap();
    assert_eq!((f.spec.job.min_replicas, f.spec.job.ring.replicas), (1, 1));
    let more = format!("{two_servers}[ring]\nreplicas = 1\nmin_replicas = 2\n");
    let e = parse(&more).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "/etc/pserver/c.toml: ring.min_replicas: 2 is more than the ring's 1 replicas"
        ),
        "{e}"
    );
}

#[test]
fn a_second_coordinator_after_the_workers_is_the_standby_and_one_among_them_is_refused() {
    let standby = "[[node]]\nid = 3\nrole = \"coordinator\"\naddress = \"127.0.0.1:7403\"\n";
    let f = parse(&format!("{GOOD}{standby}")).unwrap();
    assert_eq!(f.spec.job.standbys.to_vec(), vec![NodeId(3)]);
    assert_eq!(f.addresses.len(), 4);
    assert_eq!(f.role(NodeId(3)).unwrap(), Role::Coordinator);

    // Without ids, the layout numbers the second coordinator after the workers.
    let no_ids = format!("{GOOD}{standby}")
        .replace("id = 0\n", "")
        .replace("id = 1\n", "")
        .replace("id = 2\n", "")
        .replace("id = 3\n", "");
    let f = parse(&no_ids).unwrap();
    assert_eq!(f.spec.job.standbys.to_vec(), vec![NodeId(3)]);
    assert_eq!(f.addresses[&NodeId(3)].to_string(), "127.0.0.1:7403");

    let among = GOOD.replace("id = 2\nrole = \"worker\"", "id = 3\nrole = \"worker\"")
        + "[[node]]\nid = 2\nrole = \"coordinator\"\naddress = \"127.0.0.1:7403\"\n";
    let e = parse(&among).unwrap_err().to_string();
    assert!(e.contains("must follow the workers'"), "{e}");
}
