"""Forms: the one validation path for pages and the JSON API (errors name field and reason)."""

import re

import yaml
from django import forms
from django.core.exceptions import ValidationError

from learner.config import SCHEDULES, ConfigError, parse_config
from learner.safe_yaml import UnsafeYamlError, load_yaml

from controller.comparisons.compare import MAX_LAUNCHED
from controller.config_merge import config_has_field
from controller.comparisons.fairness import MIN_STEPS as MIN_COMPARED_STEPS
from controller.limits.limits import MAX_JSON_DEPTH, nesting_depth, value_count
from controller.models import Experiment, Schedule
from controller.overrides import MAX_OVERRIDES, MAX_SWEEP_VALUES, OverrideError, check_path, parse_overrides, parse_sweep_values
from controller.limits.quotas import QuotaExceeded, check_config
from controller.server_paths import check_server_paths

# A config from a user: the largest in configs/ is ~2,600 characters and ~150 values. Text over
# the character cap is refused unread, text of more values at the first one over, before the
# (pure-Python) constructors build anything (learner/safe_yaml.py); a JSON object is held to the
# same value count.
MAX_CONFIG_CHARS = 20_000
MAX_CONFIG_VALUES = 2_000
MAX_STEPS = 1_000_000  # learner.config.TrainConfig.steps' upper bound
DEFAULT_SCHEDULE = "streaming"
# ticked by default in "compare schedules": the four schedules (with the default 2 repeats, 8 runs)
COMPARED_PRESETS = SCHEDULES  # a comparison starts with the four built-in presets, one per schedule
# a comparison's runs per schedule: 2 by default, so each schedule has a repeat in another round;
# a sweep 1 by default (its values already multiply its runs)
DEFAULT_REPEATS, SWEEP_REPEATS, MAX_REPEATS = 2, 1, 4


class ConfigField(forms.Field):
    """A run config: YAML text (the page's textarea) or a JSON object (the API)."""

    widget = forms.Textarea(attrs={"rows": 16, "spellcheck": "false"})

    def to_python(self, value):
        if value in (None, ""):
            return {}
        if isinstance(value, dict):
            if value_count(value) > MAX_CONFIG_VALUES:
                raise ValidationError(f"more than {MAX_CONFIG_VALUES} values")
            return value
        try:
            data = load_yaml(value, MAX_CONFIG_CHARS, MAX_CONFIG_VALUES)
        except UnsafeYamlError as err:
            raise ValidationError(str(err)) from None
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ValidationError(f"expected a mapping of config sections, got {type(data).__name__}")
        if nesting_depth(data) > MAX_JSON_DEPTH:
            raise ValidationError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        return data

    def validate(self, value):
        super().validate(value)
        try:
            check_server_paths(parse_config(value))
        except ConfigError as err:
            raise ValidationError(str(err)) from None

    def prepare_value(self, value):
        return yaml.safe_dump(value, sort_keys=False) if isinstance(value, dict) else value


class ExperimentForm(forms.ModelForm):
    config = ConfigField(required=False, help_text="YAML; every field of learner.config.RunConfig")

    class Meta:
        model = Experiment
        fields = ["name", "description", "config"]

    def clean_config(self):
        config = self.cleaned_data["config"]
        try:
            check_config(self.instance.owner, parse_config(config).model_dump())
        except QuotaExceeded as err:
            raise ValidationError(err.message) from None
        return config

    def __init__(self, *args, **kwargs):
        instance = kwargs.get("instance")
        if instance is not None and instance.pk and "initial" not in kwargs:
            kwargs["initial"] = {"config": instance.config_yaml()}  # the text as written, comments kept
        super().__init__(*args, **kwargs)

    def save(self, commit=True):
        raw = self.data.get("config") if hasattr(self.data, "get") else None
        self.instance.config_text = raw if isinstance(raw, str) else ""
        return super().save(commit)


class ScheduleForm(forms.ModelForm):
    knobs = forms.JSONField(required=False, help_text='config values, e.g. {"max_staleness": 2}')

    class Meta:
        model = Schedule
        fields = ["name", "kind", "knobs"]

    def __init__(self, *args, user, instance=None, **kwargs):
        super().__init__(*args, instance=instance or Schedule(owner=user), **kwargs)
        self.user = user

    def clean_knobs(self):
        return self.cleaned_data["knobs"] or {}

    def clean_name(self):
        name = self.cleaned_data["name"]
        if Schedule.objects.visible_to(self.user).filter(name=name).exclude(pk=self.instance.pk).exists():
            raise ValidationError("a schedule with this name already exists")
        return name


OVERRIDES_HELP = f"one field=value a line, e.g. train.lr=3e-4 (at most {MAX_OVERRIDES}); validated like the config"


class OverridesField(forms.Field):
    """Dotted config fields for one launch: ``field=value`` lines (the page) or a JSON object (the
    API); the values' fit is checked against the experiment's config at launch."""

    widget = forms.Textarea(attrs={"rows": 2, "spellcheck": "false", "placeholder": "train.lr=3e-4"})

    def to_python(self, value):
        try:
            return parse_overrides(value)
        except OverrideError as err:
            raise ValidationError(str(err)) from None

    def prepare_value(self, value):
        if isinstance(value, dict):
            return "\n".join(f"{k}={v}" for k, v in value.items())
        return value


class LaunchForm(forms.Form):
    schedule = forms.ModelChoiceField(
        queryset=Schedule.objects.none(), error_messages={"invalid_choice": "no such schedule"}
    )
    steps = forms.IntegerField(
        min_value=1, max_value=MAX_STEPS, required=False, help_text="default: the experiment's train.steps"
    )
    name = forms.CharField(max_length=200, required=False)
    overrides = OverridesField(required=False, help_text=OVERRIDES_HELP)

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        visible = Schedule.objects.visible_to(user)
        field = self.fields["schedule"]
        field.queryset, field.empty_label = visible, None
        # streaming is the schedule this lab is about; else the first preset
        default = visible.filter(name=DEFAULT_SCHEDULE).first() or visible.first()
        field.initial = default.pk if default else None


class RunCreateForm(LaunchForm):
    """The API's launch: the experiment is a field, not part of the URL."""

    experiment = forms.ModelChoiceField(
        queryset=Experiment.objects.none(), error_messages={"invalid_choice": "no such experiment"}
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, user=user, **kwargs)
        self.fields["experiment"].queryset = Experiment.objects.filter(owner=user)


class ComparisonForm(forms.Form):
    """Launch the experiment under several schedules at once (views.launch_comparison), or a
    small sweep: one field over a few values under the chosen schedules."""

    schedules = forms.ModelMultipleChoiceField(
        queryset=Schedule.objects.none(), widget=forms.CheckboxSelectMultiple,
        error_messages={"invalid_choice": "no such schedule", "required": "pick at least one schedule"},
    )
    steps = forms.IntegerField(min_value=MIN_COMPARED_STEPS, max_value=MAX_STEPS,
                               help_text=f"the same for every run; at least {MIN_COMPARED_STEPS} for a median")
    name = forms.CharField(max_length=200, required=False)
    repeats = forms.IntegerField(
        required=False, widget=forms.NumberInput(attrs={
            "min": 1, "max": MAX_REPEATS, "placeholder": f"{DEFAULT_REPEATS} (a sweep: {SWEEP_REPEATS})",
            # the experiment page's run count (static/js/runcount.js) reads the defaults and the limit here
            "data-default": DEFAULT_REPEATS, "data-sweep-default": SWEEP_REPEATS, "data-max-runs": MAX_LAUNCHED}),
        error_messages={"invalid": f"a whole number of runs per schedule, 1-{MAX_REPEATS}"},
        help_text=f"runs per schedule, 1-{MAX_REPEATS}, in alternating rounds, one run at a time; the summary pools them")
    overrides = OverridesField(required=False, help_text=OVERRIDES_HELP + "; the same for every run")
    sweep_field = forms.CharField(max_length=200, required=False, label="Sweep field",
                                  help_text="optional: one config field, e.g. train.lr")
    sweep_values = forms.CharField(max_length=1000, required=False, label="Sweep values",
                                   help_text=f"2-{MAX_SWEEP_VALUES} comma-separated values, e.g. 1e-4, 3e-4; "
                                             f"one run per value and schedule (times repeats), at most {MAX_LAUNCHED} in all")

    def __init__(self, *args, user, experiment=None, **kwargs):
        # its own element ids: the experiment page holds the launch form's id_name, id_steps, ...
        kwargs.setdefault("auto_id", "compare_%s")
        super().__init__(*args, **kwargs)
        visible = Schedule.objects.visible_to(user)
        self.fields["schedules"].queryset = visible
        self.fields["schedules"].initial = [s.pk for s in visible.filter(owner__isnull=True, name__in=COMPARED_PRESETS)]
        self.experiment = experiment
        if experiment is not None:
            self.fields["steps"].initial = max(MIN_COMPARED_STEPS, experiment.run_config().train.steps)

    def clean_schedules(self):
        # in schedule order: sync first, the compare page's 1.00x reference
        return sorted(self.cleaned_data["schedules"], key=lambda s: (SCHEDULES.index(s.kind), s.name))

    def clean_repeats(self):
        repeats = self.cleaned_data.get("repeats")
        if repeats is None:  # not given: a required field would refuse any other None
            return SWEEP_REPEATS if self.data.get("sweep_field") or self.data.get("sweep_values") else DEFAULT_REPEATS
        if not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
            raise ValidationError(f"between 1 and {MAX_REPEATS} runs per schedule")
        return repeats

    def clean_sweep_field(self):
        field = self.cleaned_data["sweep_field"].strip()
        try:
            return check_path(field) if field else ""
        except OverrideError as err:
            raise ValidationError(str(err)) from None

    def clean(self):
        data = super().clean()
        field, raw = data.get("sweep_field"), self.data.get("sweep_values")
        if field and raw in (None, "", []):
            self.add_error("sweep_values", f"{field}: give 2-{MAX_SWEEP_VALUES} values to sweep")
        elif raw not in (None, "", []) and not field and "sweep_field" not in self.errors:
            self.add_error("sweep_field", "name the config field the values are for")
        elif field:
            try:
                data["sweep_values"] = parse_sweep_values(field, raw)
            except OverrideError as err:
                self.add_error("sweep_values", str(err))
            if field in (data.get("overrides") or {}):
                self.add_error("sweep_field", f"{field}: both swept and overridden; keep one")
            self.check_swept_field(field)
        self.check_run_count(data)
        return data

    def check_swept_field(self, field: str) -> None:
        """A swept field the config does not have is named before anything is counted (each value
        is still validated on the merged config at launch, controller/supervision/launching.py)."""
        if "sweep_field" not in self.errors and not config_has_field(field):
            self.add_error("sweep_field", f"{field}: unknown field")

    def check_run_count(self, data):
        schedules, values = data.get("schedules"), data.get("sweep_values")
        if not schedules or any(f in self.errors for f in ("schedules", "sweep_field", "sweep_values")):
            return
        cells = len(schedules) * (len(values) if isinstance(values, list) and values else 1)
        if not isinstance(values, list) or not values:
            if len(schedules) < 2:
                self.add_error("schedules", "pick at least two schedules (or sweep a field over one)")
        repeats = data.get("repeats") if isinstance(data.get("repeats"), int) else 1
        if cells * repeats > MAX_LAUNCHED:
            self.add_error("schedules", f"{cells * repeats} runs: pick at most {MAX_LAUNCHED} in all, schedules × "
                                        f"sweep values × repeats ({cells} × {repeats})")



TAG = re.compile(r"^[\w.:-]{1,40}$")
MAX_TAGS = 10


class NoteForm(forms.Form):
    """Tags and a free-text note of a run or a comparison (views in controller/runs_views.py)."""

    tags = forms.CharField(max_length=500, required=False, help_text="comma separated, e.g. baseline, lr-sweep")
    note = forms.CharField(max_length=10_000, required=False, widget=forms.Textarea(attrs={"rows": 3}))

    def clean_tags(self):
        tags = list(dict.fromkeys(t.strip().lower() for t in self.cleaned_data["tags"].split(",") if t.strip()))
        bad = [t for t in tags if not TAG.match(t)]
        if bad:
            raise ValidationError(f"{bad[0]!r}: a tag is 1-40 letters, digits, '.', ':', '-' or '_'")
        if len(tags) > MAX_TAGS:
            raise ValidationError(f"at most {MAX_TAGS} tags")
        return tags
