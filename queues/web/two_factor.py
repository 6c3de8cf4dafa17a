"""Two-factor login pages (queues.web.two_factor_urls, beside login and logout): a user's
own settings (set up an authenticator from a QR code, turn it off, new recovery codes) and the
code asked after the password. queues.engine.two_factor does the work and writes the audit
entries; queues.permissions sends users here while a second factor is due.

Responses that show a secret (the key while setting up, recovery codes) are never cached, and
recovery codes are shown only in the response that made them."""

import django_otp
import segno
from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import authenticate
from django.shortcuts import redirect, resolve_url
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_otp.plugins.otp_static.models import StaticDevice

from queues.engine import two_factor
from queues.permissions import (
    ENROL,
    VERIFY,
    forget_second_factor,
    render_page,
    second_factor_due,
    signed_in,
    verified_required,
)
from queues.web.security import page_to_return_to

QR_SCALE, QR_BORDER = 4, 2


def _code_field(label, *, required=True, **attrs):
    return forms.CharField(
        label=label, max_length=32, required=required,
        error_messages={"required": "Type the code."}, widget=forms.TextInput(attrs={
            "autocomplete": "one-time-code", "spellcheck": "false", "autocapitalize": "off",
            **attrs}))


class CodeForm(forms.Form):
    """A `code` field (declared by each subclass), checked by the subclass's engine call."""

    def __init__(self, user, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user

    def clean_code(self):
        code = self.cleaned_data["code"]
        try:
            self.check(code)
        except two_factor.CodeRefused as refused:
            raise forms.ValidationError(str(refused)) from None
        return code


class ConfirmForm(CodeForm):
    """The first code of a new authenticator, which confirms it."""

    code = _code_field("Code shown by the app", inputmode="numeric")

    def check(self, code):
        self.device, self.recovery_codes = two_factor.confirm(self.user, code)


class VerifyForm(CodeForm):
    """The code asked after the password: the authenticator's, or a recovery code."""

    code = _code_field("Code from your authenticator app, or a recovery code", autofocus=True)

    def check(self, code):
        self.device = two_factor.verify(self.user, code)


class ReauthForm(forms.Form):
    """Turning two-factor login off or making new recovery codes asks again for a code or the
    password, so that an unattended session cannot weaken the account."""

    code = _code_field("A code from your authenticator app or a recovery code", required=False)
    password = forms.CharField(label="or your password", required=False, max_length=4096,
                               widget=forms.PasswordInput(attrs={"autocomplete":
                                                                 "current-password"}))

    def __init__(self, request, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.request = request

    def clean(self):
        data = super().clean()
        user = self.request.user
        if data.get("code"):
            try:
                two_factor.verify(user, data["code"])
            except two_factor.CodeRefused as refused:
                self.add_error("code", str(refused))
        elif data.get("password"):
            # Through the authentication backends, so that django-axes counts and locks out
            # wrong passwords here as it does at login.
            if authenticate(self.request, username=user.get_username(),
                            password=data["password"]) is None:
                two_factor.record_failed_password(user)
                self.add_error("password", "That password is wrong.")
        else:
            raise forms.ValidationError("Type a code or your password.")
        return data


def _settings_page(request, *, confirm_form=None, reauth_form=None, status=200):
    user = request.user
    device = two_factor.authenticator(user)
    pending = None if device else two_factor.authenticator(user, confirmed=False)
    context = {
        "device": device, "pending": pending, "must_enrol": second_factor_due(user) == ENROL,
        "reauth_form": reauth_form or ReauthForm(request),
        "confirm_form": confirm_form or ConfirmForm(user),
    }
    if device:
        context["codes_left"] = two_factor.recovery_codes_left(user)
    if pending:
        qr = segno.make(pending.config_url, error="m")
        context.update(qr_uri=qr.svg_data_uri(scale=QR_SCALE, border=QR_BORDER),
                       qr_size=qr.symbol_size(scale=QR_SCALE, border=QR_BORDER)[0],
                       secret=two_factor.secret_text(pending))
    return render_page(request, "queues/two_factor.html", context, status=status)


def _codes_page(request, codes, *, first):
    return render_page(request, "queues/two_factor_codes.html",
                       {"codes": codes, "first": first})


def _verified(request, device):
    """This session has given its second factor: a new session key, as at login."""
    django_otp.login(request, device)
    request.session.cycle_key()
    forget_second_factor(request.user)


@never_cache
@require_GET
@verified_required
def settings_page(request):
    return _settings_page(request)


@require_POST
@verified_required
def setup(request):
    if two_factor.authenticator(request.user):
        messages.error(request, "Two-factor login is on already: turn it off first to change "
                                "the authenticator.")
    else:
        two_factor.start(request.user)
    return redirect("two_factor")


@never_cache
@require_POST
@verified_required
def confirm(request):
    form = ConfirmForm(request.user, request.POST)
    if not form.is_valid():
        return _settings_page(request, confirm_form=form, status=400)
    _verified(request, form.device)
    return _codes_page(request, form.recovery_codes, first=True)


@never_cache
@require_POST
@verified_required
def recovery_codes(request):
    if not two_factor.authenticator(request.user):
        messages.error(request, "Recovery codes come with an authenticator: set one up first.")
        return redirect("two_factor")
    form = ReauthForm(request, request.POST)
    if not form.is_valid():
        return _settings_page(request, reauth_form=form, status=400)
    return _codes_page(request, two_factor.regenerate_recovery_codes(request.user), first=False)


@require_POST
@verified_required
def remove(request):
    form = ReauthForm(request, request.POST)
    if not form.is_valid():
        return _settings_page(request, reauth_form=form, status=400)
    two_factor.remove(request.user, actor=request.user)
    messages.success(request, "Two-factor login is off: your password alone signs you in.")
    return redirect("two_factor")


@never_cache
@require_http_methods(["GET", "POST"])
@signed_in
def verify(request):
    target = _next(request)
    if second_factor_due(request.user) != VERIFY:
        return redirect(target)
    form = VerifyForm(request.user, request.POST or None)
    if request.method == "POST" and form.is_valid():
        _verified(request, form.device)
        if isinstance(form.device, StaticDevice):
            left = two_factor.recovery_codes_left(request.user)
            messages.warning(request, f"You signed in with a recovery code; {left} left. Make "
                                      f"new ones from Two-factor login if you are running out.")
        return redirect(target)
    return render_page(request, "queues/two_factor_verify.html", {"form": form, "next": target},
                       status=400 if form.is_bound else 200)


def _next(request) -> str:
    """Where to go once the code is given: the page asked for, if it is one of this site."""
    return page_to_return_to(request, resolve_url(settings.LOGIN_REDIRECT_URL))
