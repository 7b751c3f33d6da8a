from django.http import HttpRequest, HttpResponse


def dashboard(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def audit_log(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")
