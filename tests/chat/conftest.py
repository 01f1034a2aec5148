import pytest
from django.test import Client, RequestFactory

from chat import guests


def guest_key_of(client: Client) -> str:
    """The key in a guest's cookie, read as the views read it."""
    request = RequestFactory().get("/")
    request.COOKIES[guests.COOKIE] = client.cookies[guests.COOKIE].value
    return guests.guest_key_known(request)


@pytest.fixture
def guest() -> Client:
    """A guest who has seen the chat page, and so holds their key."""
    client = Client()
    assert client.get("/").status_code == 200
    return client
