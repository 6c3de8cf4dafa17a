from django.contrib import admin

from queues.models import AccountPolicy, DeadLetter, Item, Queue


class AccountPolicyInline(admin.TabularInline):
    model = AccountPolicy
    extra = 0


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):
    list_display = ("key", "name", "handler", "batch_size", "concurrency", "max_retries", "paused")
    list_filter = ("paused", "handler")
    search_fields = ("key", "name")
    inlines = [AccountPolicyInline]


@admin.register(AccountPolicy)
class AccountPolicyAdmin(admin.ModelAdmin):
    list_display = ("queue", "account", "weight", "max_in_flight", "paused")
    list_filter = ("queue", "paused")
    search_fields = ("account",)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Status changes go through queues.lifecycle, never through a form."""

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
