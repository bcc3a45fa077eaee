"""The session ring and the engine-to-router assignment of a router fleet (pure, property-based)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from poolcases import load_example
from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.cli import main
from rolloutpool.cli.router import router_command
from rolloutpool.reconcile.assignment import ANNOTATION_ROUTER, assignment_patches
from rolloutpool.reconcile.children import router_objects
from rolloutpool.reconcile.labels import router_selector
from rolloutpool.routing.fleetsplit import assign_engines, natural_key
from rolloutpool.routing.fleetview import FleetView, fleet_view, static_view
from rolloutpool.routing.ring import HashRing, stable_hash

KEYS = [f"traj-{i}" for i in range(6000)]
names = st.lists(st.from_regex(r"r[a-z0-9]{1,6}", fullmatch=True), min_size=1, max_size=8, unique=True)


def _shares(ring: HashRing) -> Counter[str | None]:
    return Counter(ring.owner(k) for k in KEYS)


# -- ring -----------------------------------------------------------------------------


def test_stable_hash_is_fixed_across_processes() -> None:
    assert stable_hash("traj-1") == 0x998E2CA2D0BBA9BD  # BLAKE2b: no per-process salt, unlike hash()
    assert HashRing({"a": 1, "b": 1}).owner("x") == HashRing({"b": 1, "a": 1}).owner("x")


def test_an_empty_ring_owns_nothing() -> None:
    assert HashRing({}).owner("s") is None
    assert HashRing({"a": 0}).owner("s") is None
    with pytest.raises(ValueError, match="points_per_weight"):
        HashRing({"a": 1}, points_per_weight=0)


@settings(max_examples=25, deadline=None)
@given(members=names, weights=st.lists(st.integers(1, 4), min_size=8, max_size=8))
def test_each_member_owns_about_its_weights_share(members: list[str], weights: list[int]) -> None:
    ring = HashRing(dict(zip(members, weights, strict=False)))
    total = sum(ring.weights.values())
    shares = _shares(ring)
    for member, weight in ring.weights.items():
        expected = len(KEYS) * weight / total
        assert abs(shares[member] - expected) <= 0.35 * expected + 60, (member, shares, ring.weights)


@settings(max_examples=25, deadline=None)
@given(members=names, joiner=st.from_regex(r"j[a-z0-9]{1,6}", fullmatch=True))
def test_a_joining_member_only_takes_keys(members: list[str], joiner: str) -> None:
    before = HashRing(dict.fromkeys(members, 2))
    after = HashRing(dict.fromkeys([*members, joiner], 2))
    for key in KEYS[:2000]:
        if after.owner(key) != before.owner(key):
            assert after.owner(key) == joiner


@settings(max_examples=25, deadline=None)
@given(members=st.lists(st.from_regex(r"r[a-z0-9]{1,6}", fullmatch=True), min_size=2, max_size=8, unique=True))
def test_a_leaving_member_only_gives_away_its_own_keys(members: list[str]) -> None:
    before = HashRing(dict.fromkeys(members, 1))
    after = HashRing(dict.fromkeys(members[1:], 1))
    for key in KEYS[:2000]:
        if before.owner(key) != members[0]:
            assert after.owner(key) == before.owner(key)


# -- assignment -----------------------------------------------------------------------


def _counts(assignment: dict[str, str], routers: list[str]) -> list[int]:
    held = Counter(assignment.values())
    return [held[r] for r in routers]


engines_st = st.integers(0, 12).map(lambda n: [f"p-engine-{i}" for i in range(n)])
routers_st = st.lists(st.sampled_from([f"p-router-{c}" for c in "abcdef"]), min_size=1, max_size=6, unique=True)


@settings(max_examples=200, deadline=None)
@given(engines=engines_st, routers=routers_st, old=routers_st, data=st.data())
def test_assignment_is_balanced_stable_and_total(
    engines: list[str], routers: list[str], old: list[str], data: st.DataObject
) -> None:
    previous = {e: data.draw(st.sampled_from([*old, ""])) for e in engines}
    result = assign_engines(engines=engines, routers=routers, previous=previous)
    assert set(result) == set(engines)
    assert set(result.values()) <= set(routers)
    counts = _counts(result, routers)
    assert max(counts) - min(counts) <= 1
    assert assign_engines(engines=engines, routers=routers, previous=result) == result  # stable
    assert assign_engines(engines=reversed(engines), routers=reversed(routers), previous=previous) == result


def _optimal_moves(engines: list[str], routers: list[str], previous: dict[str, str]) -> int:
    """Fewest engines that change router over every balanced assignment (brute force)."""
    low = len(engines) // len(routers)
    best = len(engines)
    for choice in itertools.product(routers, repeat=len(engines)):
        counts = Counter(choice)
        if all(low <= counts[r] <= low + 1 for r in routers):
            best = min(best, sum(previous.get(e) != r for e, r in zip(engines, choice, strict=True)))
    return best


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 6),
    routers=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True),
    data=st.data(),
)
def test_assignment_moves_as_few_engines_as_balance_allows(n: int, routers: list[str], data: st.DataObject) -> None:
    engines = [f"e{i}" for i in range(n)]
    previous = {e: data.draw(st.sampled_from(["a", "b", "c", "gone"])) for e in engines}
    result = assign_engines(engines=engines, routers=routers, previous=previous)
    moved = sum(previous[e] != r for e, r in result.items())
    assert moved == _optimal_moves(engines, routers, previous)


def test_a_dead_router_gives_its_engines_away_and_nobody_else_moves() -> None:
    engines = [f"p-engine-{i}" for i in range(6)]
    three = assign_engines(engines=engines, routers=["a", "b", "c"], previous={})
    assert _counts(three, ["a", "b", "c"]) == [2, 2, 2]
    two = assign_engines(engines=engines, routers=["a", "c"], previous=three)
    assert {e: r for e, r in two.items() if three[e] != "b"} == {e: r for e, r in three.items() if r != "b"}
    assert _counts(two, ["a", "c"]) == [3, 3]
    back = assign_engines(engines=engines, routers=["a", "c", "d"], previous=two)  # the replacement pod
    assert _counts(back, ["a", "c", "d"]) == [2, 2, 2]
    assert sum(two[e] != back[e] for e in engines) == 2
    assert assign_engines(engines=engines, routers=[], previous=three) == {}


def test_natural_order() -> None:
    assert sorted(["e-10", "e-2", "e-1"], key=natural_key) == ["e-1", "e-2", "e-10"]


# -- publishing and reading the assignment ------------------------------------------------


def _pod(
    name: str, *, ip: str | None = "10.0.0.1", ready: bool = True, router: str | None = None, gone: bool = False
) -> dict[str, Any]:
    meta: dict[str, object] = {"name": name, "annotations": {ANNOTATION_ROUTER: router} if router else {}}
    if gone:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return {"metadata": meta, "status": status}


def test_patches_name_only_changed_engines_and_skip_terminating_ones() -> None:
    engines = [_pod("p-engine-0", router="r1"), _pod("p-engine-1"), _pod("p-engine-2", router="r9", gone=True)]
    routers = [_pod("r1", ready=False), _pod("r2"), _pod("r3", ip=None), _pod("r4", gone=True)]
    assert assignment_patches(engine_pods=engines, router_pods=routers) == {"p-engine-1": "r2"}
    assert assignment_patches(engine_pods=engines, router_pods=[]) == {}


def test_the_view_weights_ready_routers_by_their_engines() -> None:
    engines = [
        _pod("p-engine-0", ip="10.1.0.1", router="ra"),
        _pod("p-engine-1", ip="10.1.0.2", router="ra"),
        _pod("p-engine-2", ip="10.1.0.3", router="rb"),
        _pod("p-engine-3", ip="10.1.0.4", router="rc"),
        _pod("p-engine-4", ip=None, router="rb"),
    ]
    routers = [_pod("ra", ip="10.2.0.1"), _pod("rb", ip="10.2.0.2"), _pod("rc", ip="10.2.0.3", ready=False)]
    view = fleet_view(engine_pods=engines, router_pods=routers, self_name="rb")
    # rc is not ready: its engine's points go where the operator would put it (ra, the roomiest with the
    # larger quota); an engine without an IP is on the ring by its assignment
    assert view.owners == {
        "p-engine-0": "ra",
        "p-engine-1": "ra",
        "p-engine-2": "rb",
        "p-engine-3": "ra",
        "p-engine-4": "rb",
    }
    assert view.peers == {"ra": "http://10.2.0.1:8080", "rb": "http://10.2.0.2:8080"}
    assert {n: (e.routable, e.url) for n, e in view.engines.items()} == {
        "p-engine-2": (True, "http://10.1.0.3:8000"),
        "p-engine-4": (False, None),
    }
    other = fleet_view(engine_pods=engines, router_pods=routers, self_name="ra")
    assert all(other.owner(k) == view.owner(k) for k in KEYS[:500])  # the same ring everywhere
    assert {view.owner(k) for k in KEYS[:500]} == {"ra", "rb"}


def _operator_pass(engines: list[dict[str, Any]], routers: list[dict[str, Any]]) -> None:
    for pod in engines:
        patch = assignment_patches(engine_pods=engines, router_pods=routers).get(pod["metadata"]["name"])
        if patch is not None:
            pod["metadata"]["annotations"][ANNOTATION_ROUTER] = patch


@settings(max_examples=40, deadline=None)
@given(engines=st.integers(2, 10), routers=st.integers(2, 4), data=st.data())
def test_a_router_replaced_moves_each_session_at_most_once_per_change(
    engines: int, routers: int, data: st.DataObject
) -> None:
    """Death, reassignment, the replacement's start and its readiness, as the routers see them one by one:
    a dead router's sessions change owner once at its death and once when the replacement is ready; the
    others only when the replacement takes their engine's points (issue 13: one re-prefill per change)."""
    names = [f"r-{c}" for c in "abcd"[:routers]]
    router_pods = [_pod(n, ip=f"10.2.0.{i}") for i, n in enumerate(names)]
    engine_pods = [_pod(f"p-engine-{i}", ip=f"10.1.0.{i}") for i in range(engines)]
    _operator_pass(engine_pods, router_pods)
    view = fleet_view(engine_pods=engine_pods, router_pods=router_pods, self_name=names[0])
    keys = KEYS[:400]
    start = {k: view.owner(k) for k in keys}
    history = {k: [start[k]] for k in keys}
    victim = data.draw(st.sampled_from(names), label="victim")
    early_ip = data.draw(st.booleans(), label="replacement has an IP at the first pass")

    def step() -> None:
        nonlocal view
        view = fleet_view(engine_pods=engine_pods, router_pods=router_pods, self_name=names[0], previous=view)
        for k in keys:
            if view.owner(k) != history[k][-1]:
                history[k].append(view.owner(k))

    dead = next(p for p in router_pods if p["metadata"]["name"] == victim)
    dead["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    step()  # the routers see the deletion before the operator does anything
    replacement = _pod("r-new", ip="10.2.0.9" if early_ip else None, ready=False)
    router_pods.append(replacement)
    _operator_pass(engine_pods, router_pods)
    step()
    router_pods.remove(dead)
    replacement["status"]["podIP"] = "10.2.0.9"
    _operator_pass(engine_pods, router_pods)
    step()  # the replacement holds engines but is not ready yet
    assert "r-new" not in set(view.owners.values())
    replacement["status"]["conditions"][0]["status"] = "True"
    step()
    _operator_pass(engine_pods, router_pods)
    step()
    assert view.owners == {p["metadata"]["name"]: p["metadata"]["annotations"][ANNOTATION_ROUTER] for p in engine_pods}
    for k, owners in history.items():
        assert victim not in owners[1:], owners
        if start[k] == victim:
            assert len(owners) <= 3, owners  # the dead router, a survivor, maybe the replacement
        else:
            assert owners in ([start[k]], [start[k], "r-new"]), owners


def test_a_static_view_splits_the_engines_like_the_operator() -> None:
    peers = {"http://127.0.0.1:1": "http://127.0.0.1:1", "http://127.0.0.1:2": "http://127.0.0.1:2"}
    urls = {f"e{i}": f"http://127.0.0.1:90{i}" for i in range(3)}
    split = assign_engines(engines=urls, routers=peers, previous={})
    view = static_view(peers=peers, split=split, engine_urls=urls, self_name="http://127.0.0.1:2")
    assert sorted(Counter(view.owners.values()).values()) == [1, 2]
    assert set(view.engines) == {e for e, r in split.items() if r == "http://127.0.0.1:2"}


# -- the operator's side ------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [1, 3])
def test_a_router_fleet_gets_its_pod_name_and_its_peers_selector(replicas: int) -> None:
    pool = load_example("simulated-pool.yaml")
    pool["metadata"].update(namespace="team-a", uid="u-1")
    pool["spec"]["router"] = {"replicas": replicas}
    spec = RolloutPoolSpec.model_validate(pool["spec"])
    deployment = router_objects(pool=pool, spec=spec, default_image="img:1")[-1]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    fleet = [a for a in args if a.startswith(("--self-name", "--peer-selector"))]
    name = pool["metadata"]["name"]
    expected = ["--self-name=$(POD_NAME)", f"--peer-selector={router_selector(name)}"] if replicas > 1 else []
    assert fleet == expected
    params = router_command.make_context("router", list(args)).params  # the router accepts them
    assert params["self_name"] == ("$(POD_NAME)" if replicas > 1 else None)


def _views(assignment: dict[str, str]) -> FleetView:
    return FleetView(owners=assignment, peers={r: f"http://{r}" for r in assignment.values()})


@settings(max_examples=30, deadline=None)
@given(engines=st.integers(3, 12), routers=st.integers(2, 5), data=st.data())
def test_only_a_dead_routers_sessions_change_owner(engines: int, routers: int, data: st.DataObject) -> None:
    names = [f"p-engine-{i}" for i in range(engines)]
    members = [f"p-router-{c}" for c in "abcde"[:routers]]
    before = assign_engines(engines=names, routers=members, previous={})
    victim = data.draw(st.sampled_from(members))
    after = assign_engines(engines=names, routers=[m for m in members if m != victim], previous=before)
    old, new = _views(before), _views(after)
    for key in KEYS[:1500]:
        if old.owner(key) != victim:
            assert new.owner(key) == old.owner(key)
    shares = Counter(new.owner(k) for k in KEYS)
    for member in set(after.values()):  # a router's share of sessions follows its share of engines
        expected = len(KEYS) * list(after.values()).count(member) / engines
        assert abs(shares[member] - expected) <= 0.3 * expected, (shares, after)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replica", "e0=http://127.0.0.1:1", "--self-url", "http://127.0.0.1:2"], "static fleet needs"),
        (["--replica", "e0=http://127.0.0.1:1", "--peer-urls", "http://127.0.0.1:2"], "static fleet needs"),
        (["--replica", "e0=http://127.0.0.1:1", "--self-url", "ftp://x", "--peer-urls", "http://a:1"], "http"),
        (["--discover-namespace", "ns", "--discover-selector", "a=b", "--self-name", "r-0"], "--peer-selector"),
        (
            ["--discover-namespace", "ns", "--self-url", "http://a:1", "--peer-urls", "http://a:1"],
            "static fleet needs",
        ),
    ],
)
def test_fleet_options_that_do_not_fit_are_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["router", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
