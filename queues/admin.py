from django import forms
from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Exists, OuterRef
from django.forms.fields import InvalidJSONInput, JSONString
from django.urls import reverse
from django.utils.html import format_html
from django_q.admin import ScheduleAdmin
from django_q.models import Schedule

from queues.engine import audit, handlers, strictjson
from queues.models import AccountPolicy, DeadLetter, Item, Queue, canonical
from queues.permissions import two_factor_installed


class AuditedAdmin(admin.ModelAdmin):
    """Edits made through Django's admin site land in the audit log like every other
    mutation."""

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        audit.record(request.user, "admin.change" if change else "admin.add",
                     queue_key=_queue_key(obj), target=f"{obj._meta.model_name}:{obj}",
                     filter={"fields": form.changed_data}, counts={"rows": 1})

    def save_formset(self, request, form, formset, change):
        super().save_formset(request, form, formset, change)
        changed = len(formset.new_objects) + len(formset.changed_objects)
        if changed or formset.deleted_objects:
            audit.record(request.user, "admin.change", queue_key=_queue_key(form.instance),
                         target=f"{formset.model._meta.model_name} of {form.instance}",
                         counts={"rows": changed + len(formset.deleted_objects)})

    def delete_model(self, request, obj):
        target, key = f"{obj._meta.model_name}:{obj}", _queue_key(obj)
        super().delete_model(request, obj)
        audit.record(request.user, "admin.delete", queue_key=key, target=target,
                     counts={"rows": 1})

    def delete_queryset(self, request, queryset):
        targets = [str(obj) for obj in queryset[:20]]
        rows = queryset.count()
        super().delete_queryset(request, queryset)
        audit.record(request.user, "admin.delete", target=f"{queryset.model._meta.model_name}",
                     filter={"objects": targets}, counts={"rows": rows})


def _queue_key(obj) -> str:
    if isinstance(obj, Queue):
        return obj.key
    queue = getattr(obj, "queue", None)
    return queue.key if queue is not None else ""


class StrictJSONFormField(forms.JSONField):
    """JSON held to the API's rules: Django's own field stores a NUL (which PostgreSQL refuses,
    a 500) or a lone surrogate (after which the page cannot be drawn), and nesting a few
    thousand deep ends its json.loads in a RecursionError."""

    def to_python(self, value):
        if self.disabled or value in self.empty_values or not isinstance(value, str):
            return super().to_python(value)
        try:
            converted = strictjson.decode_text(value)
        except strictjson.JSONBodyError as exc:
            where = "" if exc.field == "body" else f" (at {exc.field})"
            raise ValidationError(f"Not valid JSON{where}: {exc.message}.",
                                  code="invalid") from None
        return JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data, initial):
        if self.disabled or data is None:
            return super().bound_data(data, initial)
        try:
            return strictjson.decode_text(data)
        except strictjson.JSONBodyError:
            return InvalidJSONInput(data)


class QueueForm(forms.ModelForm):
    # A queue runs a registered handler, or its items fail one by one in the workers.
    handler = forms.ChoiceField(choices=lambda: [(name, name) for name in handlers.names()])

    class Meta:
        model = Queue
        fields = "__all__"  # noqa: DJ007 - the admin shows every field, as without this form


@admin.register(Queue)
class QueueAdmin(AuditedAdmin):
    form = QueueForm
    formfield_overrides = {models.JSONField: {"form_class": StrictJSONFormField}}
    list_display = ("key", "name", "handler", "batch_size", "concurrency", "max_retries", "paused")
    list_filter = ("paused", "handler")
    search_fields = ("key", "name")
    # Account policies have their own paginated, searchable list: inlined, a queue with
    # thousands of them made a page of thousands of fields that could not be saved.
    readonly_fields = ("account_policies",)

    @admin.display(description="Account policies")
    def account_policies(self, queue):
        if queue.pk is None:
            return "Save the queue first."
        url = reverse(f"{self.admin_site.name}:queues_accountpolicy_changelist")
        count = AccountPolicy.objects.filter(queue=queue).count()
        return format_html('<a href="{}?queue__id__exact={}">{} account polic{} on this queue</a>',
                           url, queue.pk, count, "y" if count == 1 else "ies")


class AccountPolicyForm(forms.ModelForm):
    class Meta:
        model = AccountPolicy
        fields = ("queue", "account", "weight", "max_in_flight", "paused", "paused_by", "paused_at",
                  "max_ready")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Exactly as typed, so that the model's validator refuses a space at either end
        # rather than a stripped name matching another account.
        if "account" in self.fields:
            self.fields["account"].strip = False

    def clean_account(self) -> str:
        # As items store it, or the policy would name an account no item has.
        return canonical(self.cleaned_data["account"])


@admin.register(AccountPolicy)
class AccountPolicyAdmin(AuditedAdmin):
    form = AccountPolicyForm
    list_display = ("queue", "account", "weight", "max_in_flight", "max_ready", "paused")
    list_filter = ("queue", "paused")
    search_fields = ("account",)
    list_select_related = ("queue",)
    list_per_page = 50


class ReadOnlyAdmin(admin.ModelAdmin):
    """Status changes go through queues.engine.lifecycle, never through a form."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Item)
class ItemAdmin(ReadOnlyAdmin):
    list_display = ("id", "queue", "account", "identifier", "status", "attempts", "run_at",
                    "created_at")
    list_filter = ("queue", "status")
    search_fields = ("=identifier", "=account")
    # The changelist must not count millions of rows on every page view.
    show_full_result_count = False
    list_select_related = ("queue",)


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    list_display = ("id", "queue", "account", "item", "reason", "attempts", "created_at",
                    "replayed_at")
    list_filter = ("queue", "reason")
    show_full_result_count = False
    raw_id_fields = ("item",)


# Users and roles (groups) are edited here too; a role change is a mutation like any other, so
# Django's own user and group admins are replaced by audited ones.
admin.site.unregister(User)
admin.site.unregister(Group)


# Django's permission bits beyond the roles: an Admin who is not a superuser may not grant
# them (to anyone, themselves included), or they could take what the Admin role withholds, such
# as django-q2's models.
PRIVILEGE_FIELDS = {User: ("is_superuser", "user_permissions"), Group: ("permissions",)}


class RolesOnlyForAdmins:
    """For a user who is not a superuser: the privilege fields read-only, and superusers' rows
    (their password, second factor and roles) left alone."""

    def get_readonly_fields(self, request, obj=None):
        fields = super().get_readonly_fields(request, obj)
        if request.user.is_superuser:
            return fields
        return (*fields, *PRIVILEGE_FIELDS[self.model])

    def has_change_permission(self, request, obj=None):
        if getattr(obj, "is_superuser", False) and not request.user.is_superuser:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        if getattr(obj, "is_superuser", False) and not request.user.is_superuser:
            return False
        return super().has_delete_permission(request, obj)


@admin.register(User)
class AuditedUserAdmin(RolesOnlyForAdmins, AuditedAdmin, UserAdmin):
    """Also shows who has two-factor login on and lets an Admin reset it (the user then signs in
    with the password alone and may set up a new authenticator), when django-otp is installed."""

    actions = ["reset_two_factor"]

    def user_change_password(self, request, id, form_url=""):
        response = super().user_change_password(request, id, form_url)
        if request.method == "POST" and response.status_code == 302:
            target = f"user:{self.get_object(request, id)}"
            audit.record(request.user, "admin.password", target=target, counts={"rows": 1})
        return response

    def get_queryset(self, request):
        users = super().get_queryset(request)
        if not two_factor_installed():
            return users
        from django_otp.plugins.otp_totp.models import TOTPDevice

        return users.annotate(two_factor_on=Exists(
            TOTPDevice.objects.filter(user=OuterRef("pk"), confirmed=True)))

    def get_list_display(self, request):
        shown = super().get_list_display(request)
        return (*shown, "two_factor") if two_factor_installed() else shown

    def get_actions(self, request):
        actions = super().get_actions(request)
        if not two_factor_installed():
            actions.pop("reset_two_factor", None)
        return actions

    @admin.display(description="Two-factor login", boolean=True, ordering="two_factor_on")
    def two_factor(self, user):
        return user.two_factor_on

    @admin.action(description="Reset two-factor login of the selected users",
                  permissions=["change"])
    def reset_two_factor(self, request, queryset):
        from queues.engine import two_factor

        if not request.user.is_superuser:
            queryset = queryset.filter(is_superuser=False)
        users = [user for user in queryset if user.two_factor_on]
        for user in users:
            two_factor.remove(user, actor=request.user)
        self.message_user(request, f"Two-factor login reset for {len(users)} user(s): they sign "
                                   "in with their password and may set up a new authenticator.")


@admin.register(Group)
class AuditedGroupAdmin(RolesOnlyForAdmins, AuditedAdmin, GroupAdmin):
    pass


# A django-q2 schedule names any importable function for the workers to run, and its admin is
# not audited: the product keeps its own schedules (queues.engine.schedules, rewritten at each
# migrate), so here they are for reading only, superusers included.
admin.site.unregister(Schedule)


@admin.register(Schedule)
class ReadOnlyScheduleAdmin(ReadOnlyAdmin, ScheduleAdmin):
    pass


if two_factor_installed():
    from django_otp.plugins.otp_static.models import StaticDevice
    from django_otp.plugins.otp_totp.models import TOTPDevice

    # Authenticator keys and recovery codes are for their owner's eyes only, and a second factor
    # is removed only through the audited reset above; django-otp's device admins (registered
    # by now when its apps come before queues in INSTALLED_APPS) would show and edit both.
    for model in (TOTPDevice, StaticDevice):
        if admin.site.is_registered(model):
            admin.site.unregister(model)
