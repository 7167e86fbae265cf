"""A migration that rewrites or scans a table that is large at fleet size, or runs code over
rows, says so in its docstring with its cost: an operator plans the upgrade's downtime
from it.

What PostgreSQL (11 and later; production runs 16, docker-compose.yml) does per operation:
- a new column that is nullable, or NOT NULL with a constant default (Django evaluates a
  Python default once and sends it as a literal; `db_default` is a literal unless it is an
  expression), is a catalog change: no rewrite, whatever the table's size; a volatile
  expression default (random(), clock_timestamp()) rewrites it, so any expression is flagged;
- a column type change rewrites the table (except varchar widened or made text);
- NULL to NOT NULL scans every row under an exclusive lock;
- an index, a unique constraint or a foreign key built without CONCURRENTLY / NOT VALID
  reads the whole table while writes wait;
- RunPython and RunSQL do what their code says, which this test cannot read: every one
  states its cost, however small.
A migration whose docstring has a line starting `Cost at fleet size:` passes.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import connections, migrations, models
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.state import ModelState, ProjectState

MARKER = "Cost at fleet size:"

# Tables large at fleet size (5,000-node / 50,000-pod clusters, bench/fleet.py; 100,000
# orgs, bench/orgs_sweep.py), by (app label, model name), and why. Every other table holds
# a row per cluster, org exemption, defrag job, served model, operator action or token:
# thousands at most, which PostgreSQL rewrites or indexes in well under a second.
LARGE = {
    ("audit", "auditentry"): "every change to an org, node or workload, kept for good: tens of millions of rows",
    ("pruning", "prunedecision"): "a row per idle candidate and per skip reason and owner, every 3 min per "
                                  "cluster (skips kept 7 days, prunes for good): millions of rows",
    ("pruning", "prunerun"): "one per cluster every 3 min, with its queries and notes: 175,000 rows a cluster a year",
    ("orgs", "dormancyswitch"): "one per org per dormancy switch: up to 100,000 orgs, millions of rows",
    ("orgs", "org"): "up to 100,000 rows, and every activity call writes one: a lock held for a scan stops "
                     "the activity API",
    ("capacity", "binpackrun"): "one per cluster every 5 min, each with up to 1,000 changes in JSON: 100,000 "
                                "rows and gigabytes a cluster a year",
    ("capacity", "defraglogline"): "up to 500 lines (LOG_HEAD + LOG_TAIL) of every defrag job ever run: "
                                   "millions of rows after a few thousand jobs",
}


@dataclass(frozen=True)
class Cost:
    migration: str
    operation: str
    why: str

    def __str__(self) -> str:
        return f"{self.migration}: {self.operation}: {self.why}"


def _db_type(field, connection) -> str:
    return (field.db_type(connection) or "").lower()


def _widened(old: str, new: str) -> bool:
    """varchar(n) to varchar(m >= n), or varchar to text: PostgreSQL keeps the rows as they are."""
    if not old.startswith("varchar"):
        return False
    if new == "text":
        return True
    if not new.startswith("varchar"):
        return False
    size = lambda t: int(t[t.index("(") + 1:t.index(")")])  # noqa: E731
    return size(new) >= size(old)


def _target(field) -> str:
    """The model a historical relation points at, as "app.model" (state fields hold it as a name)."""
    target = field.remote_field.model
    return (target if isinstance(target, str) else target._meta.label).lower()


def _computed_default(field) -> bool:
    """A `db_default` that is a database expression, not a plain value."""
    default = getattr(field, "db_default", models.NOT_PROVIDED)
    return hasattr(default, "resolve_expression") and not isinstance(default, models.Value)


def operation_cost(operation, *, app_label: str, state: ProjectState, created: set, connection) -> str:
    """Why `operation`, applied to `state`, rewrites or scans a large table or runs code; "" when it does not."""
    if isinstance(operation, (migrations.RunPython, migrations.RunSQL)):
        return "runs code over rows (which, and how many, only its docstring can say)"
    model = getattr(operation, "model_name_lower", None) or getattr(operation, "model_name", "")
    key = (app_label, (model or "").lower())
    if key not in LARGE or key in created:
        return ""
    table = f"{key[0]}.{key[1]} ({LARGE[key]})"
    if isinstance(operation, migrations.AddField):
        field = operation.field
        if getattr(field, "generated", False):
            return f"adds a generated column to {table}: rewrites it"
        if _computed_default(field):
            # PostgreSQL stores a non-volatile expression's value once; a volatile one
            # (random(), clock_timestamp()…) is computed per row: its docstring says which.
            return f"adds a column whose default is a database expression to {table}: rewrites it if volatile"
        if field.db_index or field.unique or field.is_relation:
            return f"adds an indexed or foreign-key column to {table}: reads it while writes wait"
        return ""
    if isinstance(operation, migrations.AlterField):
        old = state.models[key].fields[operation.name]
        new = operation.field
        why = []
        if not (old.is_relation or new.is_relation):   # a key's type is its target's: checked below
            old_type, new_type = _db_type(old, connection), _db_type(new, connection)
            if old_type != new_type and not _widened(old_type, new_type):
                why.append(f"changes a column from {old_type} to {new_type}: rewrites")
        if old.null and not new.null:
            why.append("makes a column NOT NULL: scans every row")
        if (new.db_index and not old.db_index) or (new.unique and not old.unique):
            why.append("adds an index: reads every row while writes wait")
        if new.is_relation and (not old.is_relation or _target(old) != _target(new)):
            why.append("adds a foreign key: reads every row to validate it")
        return f"{'; '.join(why)} of {table}" if why else ""
    if isinstance(operation, AddIndexConcurrently):
        return ""
    if isinstance(operation, migrations.AddIndex):
        return f"builds an index on {table} without CONCURRENTLY: reads it while writes wait"
    if isinstance(operation, migrations.AddConstraint):
        return f"adds a constraint to {table}: reads every row (and builds an index for a unique one)"
    if isinstance(operation, (migrations.AlterUniqueTogether, migrations.AlterIndexTogether)):
        option = "unique_together" if isinstance(operation, migrations.AlterUniqueTogether) else "index_together"
        before = set(state.models[key].options.get(option) or ())
        if set(operation.option_value or ()) - before:
            return f"adds an index to {table} without CONCURRENTLY: reads it while writes wait"
    return ""


def migration_costs(loader: MigrationLoader, key: tuple[str, str], connection) -> list[Cost]:
    migration = loader.graph.nodes[key]
    state = loader.project_state(key, at_end=False)
    created = {(key[0], op.name_lower) for op in migration.operations if isinstance(op, migrations.CreateModel)}
    costs = []
    for operation in migration.operations:
        why = operation_cost(operation, app_label=key[0], state=state, created=created, connection=connection)
        if why:
            costs.append(Cost(f"{key[0]}.{key[1]}", operation.describe(), why))
        operation.state_forwards(key[0], state)
    return costs


def project_migrations(loader: MigrationLoader) -> list[tuple[str, str]]:
    from tests.upgrade.test_upgrade_from_release import project_apps

    ours = project_apps()
    return sorted(key for key in loader.graph.nodes if key[0] in ours)


def states_cost(migration) -> bool:
    """Whether the migration's module docstring has a `Cost at fleet size:` line with words after it."""
    doc = sys.modules[migration.__module__].__doc__ or ""
    return any(line.strip().startswith(MARKER) and line.strip() != MARKER for line in doc.splitlines())


def test_every_migration_that_rewrites_or_scans_a_large_table_or_runs_code_states_its_cost():
    loader = MigrationLoader(None, ignore_no_migrations=True)
    connection = connections["default"]
    missing = []
    for key in project_migrations(loader):
        costs = migration_costs(loader, key, connection)
        if costs and not states_cost(loader.graph.nodes[key]):
            missing.extend(costs)
    assert not missing, (
        "These migrations rewrite or scan a table that is large at fleet size, or run code over rows, and "
        f"their module docstring has no line starting {MARKER!r} (what it does to how many rows, and how "
        "long it takes or locks at fleet size):\n" + "\n".join(map(str, missing)))


# ---- the rules themselves, on operations of their own -------------------------------------------

def _state_with_decision() -> ProjectState:
    state = ProjectState()
    state.add_model(ModelState("pruning", "PruneDecision", [
        ("id", models.BigAutoField(primary_key=True)),
        ("reason", models.CharField(max_length=64)),
        ("count", models.IntegerField(null=True)),
    ]))
    state.add_model(ModelState("orgs", "WorkloadExemption", [
        ("id", models.BigAutoField(primary_key=True)),
        ("reason", models.CharField(max_length=64)),
    ]))
    return state


@pytest.mark.parametrize(("operation", "flagged"), [
    (migrations.AddField("prunedecision", "note", models.TextField(blank=True, default="")), False),
    (migrations.AddField("prunedecision", "note", models.TextField(null=True)), False),
    (migrations.AddField("prunedecision", "seen", models.DateTimeField(db_default=models.functions.Now())), True),
    (migrations.AddField("prunedecision", "seen", models.DateTimeField(null=True, db_index=True)), True),
    (migrations.AlterField("prunedecision", "reason", models.CharField(max_length=64, help_text="why")), False),
    (migrations.AlterField("prunedecision", "reason", models.CharField(max_length=200)), False),
    (migrations.AlterField("prunedecision", "reason", models.TextField()), False),
    (migrations.AlterField("prunedecision", "reason", models.CharField(max_length=10)), True),
    (migrations.AlterField("prunedecision", "count", models.BigIntegerField(null=True)), True),
    (migrations.AlterField("prunedecision", "count", models.IntegerField(default=1)), True),
    (migrations.AlterField("prunedecision", "reason", models.CharField(max_length=64, db_index=True)), True),
    (migrations.AddIndex("prunedecision", models.Index(fields=["reason"], name="pd_reason")), True),
    (AddIndexConcurrently("prunedecision", models.Index(fields=["reason"], name="pd_reason")), False),
    (migrations.AddConstraint("prunedecision", models.CheckConstraint(condition=models.Q(count__gte=0),
                                                                      name="pd_count")), True),
    (migrations.AddIndex("workloadexemption", models.Index(fields=["reason"], name="we_reason")), False),
    (migrations.RunPython(migrations.RunPython.noop), True),
    (migrations.RunSQL("SELECT 1"), True),
], ids=lambda v: v.describe() if hasattr(v, "describe") else str(v))
def test_the_rules_flag_what_rewrites_or_scans_a_large_table(operation, flagged):
    app = "orgs" if getattr(operation, "model_name_lower", "") == "workloadexemption" else "pruning"
    why = operation_cost(operation, app_label=app, state=_state_with_decision(), created=set(),
                         connection=connections["default"])
    assert bool(why) is flagged, why


def test_a_large_table_created_in_the_same_migration_is_empty_and_costs_nothing():
    why = operation_cost(migrations.AddIndex("prunedecision", models.Index(fields=["reason"], name="pd_reason")),
                         app_label="pruning", state=_state_with_decision(), created={("pruning", "prunedecision")},
                         connection=connections["default"])
    assert why == ""
