"""API token console pages: a tenant admin's tokens, issuing one (its secret shown once), revoking one."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_POST

from fleet.models import APIToken, Membership, Tenant
from fleet.tenancy import tokens
from fleet.tenancy.forms import TokenForm
from fleet.tenancy.scoping import has_role


def _tokens_page(
    request: HttpRequest, form: TokenForm, issued: tokens.IssuedToken | None = None, status: int = 200
) -> HttpResponse:
    admin_tenants = [
        t for t in Tenant.objects.visible_to(request.user) if has_role(request.user, t, "admin")
    ]
    token_rows = APIToken.objects.filter(tenant__in=admin_tenants).select_related(
        "tenant", "created_by", "created_by_token"
    )
    response = render(
        request,
        "fleet/tokens.html",
        {
            "tokens": token_rows,
            "tenants": admin_tenants,
            "roles": Membership.Role.choices,
            "form": form,
            "issued": issued,
        },
        status=status,
    )
    # The page that shows a new secret is not kept by the browser or any cache on the way.
    add_never_cache_headers(response)
    return response


@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    return _tokens_page(request, TokenForm(actor=request.user))


@login_required
@require_POST
def token_create(request: HttpRequest) -> HttpResponse:
    """Issue a token and show its secret in this response only: it is never written to the
    session, a message or the database (which keeps only its HMAC)."""
    form = TokenForm(request.POST, actor=request.user)
    issued = form.save()
    if issued is None:
        return _tokens_page(request, form, status=form.status_code)
    return _tokens_page(request, TokenForm(actor=request.user), issued=issued)


@login_required
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(APIToken.objects.visible_to(request.user), pk=pk)
    # Too low a role is a 403 page naming the role needed, as on every console action.
    tokens.revoke(request.user, token, request.POST.get("reason", ""))
    messages.success(request, f"Token {token.name} revoked.")
    return redirect("fleet:tokens")
