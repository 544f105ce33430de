"""Routes are objects (:class:`slimrl.patching.spec.Route`): a trainer's row names the routes it takes with their
entry methods, and who uses a route, which patches its users share and which TRL subclasses inherit it are read
from those declarations."""

from __future__ import annotations

import sys
import types

from slimrl.compat.trl_info import has_fused_head
from slimrl.patching import derived, table
from slimrl.patching.machinery.catalog import Shipped
from slimrl.patching.machinery.registry import patches
from slimrl.patching.routes import fused_head, method_capture, score_positions
from slimrl.patching.spec import FIRST_CONTACT, MEMORY_PATHS


def test_each_route_is_declared_once_in_its_module_and_found_from_the_rows():
    assert set(table.routes()) == {method_capture.ROUTE, fused_head.ROUTE, score_positions.ROUTE}
    for route in table.routes():
        users = table.users_of(route)
        assert users and all(table.TRAINERS[n].uses(route) for n in users)
        assert not [n for n, s in table.TRAINERS.items() if s.uses(route) and n not in users]
    assert fused_head.ROUTE.serves() == has_fused_head()  # the release range is the route's own
    assert method_capture.ROUTE.serves() and score_positions.ROUTE.serves()


def test_a_routes_shared_patches_are_installed_for_exactly_its_users():
    kernel = next(p for p in patches() if p.attribute == "_ChunkedLogProbFunction")
    users = table.users_of(fused_head.ROUTE)
    # its users, then the subclasses that inherit one of their routes (derived.VERIFIED_ROUTES)
    assert kernel.algorithms[: len(users)] == users
    assert set(kernel.algorithms[len(users) :]) <= set(derived.VERIFIED_ROUTES)


def test_a_subclass_keeps_a_route_only_while_it_keeps_every_entry_method(monkeypatch):
    from trl import DPOTrainer

    class Keeps(DPOTrainer):
        pass

    class Overrides(DPOTrainer):
        def compute_ref_log_probs(self, *args, **kwargs):  # one of DPO's fused-head entries
            return super().compute_ref_log_probs(*args, **kwargs)

    module = types.ModuleType("planted_trainers")
    module.Keeps, module.Overrides = Keeps, Overrides
    monkeypatch.setitem(sys.modules, "planted_trainers", module)
    monkeypatch.setattr(derived, "VERIFIED_ROUTES", {"keeps": "planted", "overrides": "planted"})
    shipped = tuple(
        Shipped(name, f"planted_trainers:{cls}", None, "planted_trainers")
        for name, cls in (("keeps", "Keeps"), ("overrides", "Overrides"))
    )
    dpo = table.TRAINERS["dpo"]
    assert "compute_ref_log_probs" in dpo.route_entries
    found = derived.derive({"dpo": dpo}, shipped)
    assert found.specs["keeps"].about.layer == MEMORY_PATHS and found.specs["keeps"].uses(fused_head.ROUTE)
    assert found.specs["overrides"].about.layer == FIRST_CONTACT and not found.specs["overrides"].routes
    assert found.users == {"dpo": {"keeps"}}
