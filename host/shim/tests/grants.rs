//! Grants as a host writes them and as the shim matches them: the forms
//! `pier run --listen/--connect` and config files take, deny by default,
//! wildcards, the privileged-port rule, and malformed grants as errors
//! that name what was wrong.

use pier_shim::{ConnectGrant, Grants, PortGrant};
use pier_stack::VsockAddr;

#[test]
fn every_documented_form_parses_and_prints_back() {
    assert_eq!("1234".parse(), Ok(PortGrant::Port(1234)));
    assert_eq!("*".parse(), Ok(PortGrant::Any));
    assert_eq!(" 80 ".parse(), Ok(PortGrant::Port(80)), "surrounding blanks are ignored");
    assert_eq!("2:5000".parse(), Ok(ConnectGrant { cid: Some(2), port: Some(5000) }));
    assert_eq!("*:80".parse(), Ok(ConnectGrant { cid: None, port: Some(80) }));
    assert_eq!("3:*".parse(), Ok(ConnectGrant { cid: Some(3), port: None }));
    assert_eq!("*:*".parse(), Ok(ConnectGrant::ANY));
    assert_eq!("*".parse(), Ok(ConnectGrant::ANY));
    for text in ["1234", "*"] {
        assert_eq!(text.parse::<PortGrant>().unwrap().to_string(), text);
    }
    for text in ["2:5000", "*:80", "3:*", "*"] {
        assert_eq!(text.parse::<ConnectGrant>().unwrap().to_string(), text);
    }
}

#[test]
fn malformed_grants_are_errors_that_name_the_grant() {
    for bad in ["", "x", "-1", "4294967295", "1:", ":1", "1:2:3", "1 2", "99999999999", "2-5000"] {
        let err = bad.parse::<ConnectGrant>().expect_err(bad);
        assert!(err.to_string().contains(&format!("{:?}", bad.trim())), "{bad:?}: {err}");
    }
    for bad in ["", "x", "1:2", "4294967295", "+5", "12x"] {
        let err = bad.parse::<PortGrant>().expect_err(bad);
        assert!(err.to_string().contains(&format!("{bad:?}")), "{bad:?}: {err}");
    }
    let err = "2-5000".parse::<ConnectGrant>().unwrap_err();
    assert!(err.to_string().contains("expected CID:PORT or *"), "{err}");
    let err = "x:80".parse::<ConnectGrant>().unwrap_err();
    assert!(err.to_string().contains("the CID"), "{err}");
    let err = "2:x".parse::<ConnectGrant>().unwrap_err();
    assert!(err.to_string().contains("the port"), "{err}");
}

#[test]
fn nothing_is_allowed_without_a_grant() {
    for grants in [Grants::none(), Grants::default()] {
        for port in [0, 80, 1023, 1024, 5000, u32::MAX] {
            assert!(!grants.may_listen(port), "listen on {port}");
        }
        for (cid, port) in [(1, 1234), (2, 5000), (3, 80), (u32::MAX, u32::MAX)] {
            assert!(!grants.may_connect(VsockAddr::new(cid, port)), "connect to {cid}:{port}");
        }
    }
}

#[test]
fn a_grant_allows_what_it_names_and_nothing_next_to_it() {
    let grants = Grants {
        listen: vec![PortGrant::Port(80), PortGrant::Port(1234)],
        connect: vec!["2:5000".parse().unwrap(), "3:*".parse().unwrap()],
    };
    assert!(grants.may_listen(80) && grants.may_listen(1234));
    assert!(!grants.may_listen(1235) && !grants.may_listen(81));
    assert!(grants.may_connect(VsockAddr::new(2, 5000)));
    assert!(!grants.may_connect(VsockAddr::new(2, 5001)));
    assert!(grants.may_connect(VsockAddr::new(3, 7)) && grants.may_connect(VsockAddr::new(3, 1)));
    assert!(
        !grants.may_connect(VsockAddr::new(1, 7)),
        "the local CID is a grant of its own, even where it reaches the same socket as 3"
    );
    assert!(!grants.may_listen(5000), "a connect grant allows no listening");
}

#[test]
fn wildcards_cover_their_part_only() {
    let any_cid = Grants { listen: vec![], connect: vec!["*:80".parse().unwrap()] };
    assert!(any_cid.may_connect(VsockAddr::new(2, 80)));
    assert!(any_cid.may_connect(VsockAddr::new(77, 80)));
    assert!(!any_cid.may_connect(VsockAddr::new(2, 81)));

    let everything = Grants { listen: vec![PortGrant::Any], connect: vec![ConnectGrant::ANY] };
    assert!(everything.may_connect(VsockAddr::new(77, 1)));
    assert!(everything.may_listen(1024) && everything.may_listen(60000));
    assert!(!everything.may_listen(1023), "a wildcard does not cover privileged ports");
    assert!(!everything.may_listen(80), "a wildcard does not cover privileged ports");
    assert!(!everything.may_listen(u32::MAX), "VMADDR_PORT_ANY is not a port to grant");
    let named = Grants { listen: vec![PortGrant::Port(80)], connect: vec![] };
    assert!(named.may_listen(80), "a privileged port is granted by naming it");
}

#[test]
fn a_grant_covers_only_grants_that_allow_no_more_than_it() {
    let port = |p| PortGrant::Port(p);
    assert!(PortGrant::Any.covers(port(8080)));
    assert!(PortGrant::Any.covers(PortGrant::Any));
    assert!(!PortGrant::Any.covers(port(80)), "`*` is not a privileged port's grant");
    assert!(port(80).covers(port(80)));
    assert!(!port(8080).covers(PortGrant::Any));
    assert!(!port(8080).covers(port(8081)));
    let connect = |text: &str| text.parse::<ConnectGrant>().unwrap();
    assert!(connect("*").covers(connect("2:5000")));
    assert!(connect("*").covers(connect("*")));
    assert!(connect("2:*").covers(connect("2:5000")));
    assert!(connect("*:53").covers(connect("7:53")));
    assert!(!connect("2:5000").covers(connect("2:*")));
    assert!(!connect("2:*").covers(connect("*:5000")));
    assert!(!connect("*:53").covers(connect("*")));
    assert!(!connect("2:5000").covers(connect("3:5000")));
}
