# Sourced by the trial scripts (kill_resume_trials.sh, stop_resume_trials.sh) and by
# bench/two_launchers.sh: the case study's data as .npy files, and a comparison of two .npz
# files member by member.

# extract_case_study ROOT DIR: DIR/x.npy and DIR/y.npy from examples/data/seed_case_study.npz
# (stdlib Python only: the members are .npy already).
extract_case_study() {
  python3 - "$1/examples/data/seed_case_study.npz" "$2" <<'PY'
import sys, zipfile
src, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(src) as z:
    for m in ("x", "y"):
        open(f"{out}/{m}.npy", "wb").write(z.read(m + ".npy"))
PY
}

# same_weights A B: the members' bytes are equal (the zip headers carry timestamps).
same_weights() {
  python3 - "$1" "$2" <<'PY'
import sys, zipfile
a, b = (zipfile.ZipFile(p) for p in sys.argv[1:3])
na, nb = sorted(a.namelist()), sorted(b.namelist())
sys.exit(0 if na == nb and all(a.read(n) == b.read(n) for n in na) else 1)
PY
}
