//! The layout holds: no new import circle between the production files of a crate
//! (`scripts/import_circles.py`, with the circles still to be broken listed beside it).

/// No import circle beyond those listed as still to be broken, and none listed that is
/// gone; and the check finds a circle where there is one.
#[test]
fn no_new_import_circle_between_the_files_of_a_crate() {
    let out = pulse_tests::python_script("import_circles.py", &[]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // A crate of two files that read each other's items: one circle, named.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod c;\n").unwrap();
    std::fs::write(
        src.join("a.rs"),
        "pub struct A;\npub fn f() -> crate::b::B {\n    crate::b::B\n}\n",
    )
    .unwrap();
    std::fs::write(
        src.join("b.rs"),
        "pub struct B;\npub fn g() -> super::a::A {\n    super::a::A\n}\n",
    )
    .unwrap();
    // One that only reads: no circle of its own.
    std::fs::write(
        src.join("c.rs"),
        "pub fn h() -> crate::a::A {\n    crate::a::A\n}\n",
    )
    .unwrap();
    let out =
        pulse_tests::python_script("import_circles.py", &[std::path::Path::new("--dir"), &src]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "a.rs b.rs");
}
