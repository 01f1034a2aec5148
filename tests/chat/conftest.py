import pytest
from django.contrib.auth.models import Permission
from django.test import Client, RequestFactory

from accounts.models import User
from chat import guests
from chat.models import AgentProfile


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


def make_agent(username: str, *, display_name: str = "", capacity: int = 3) -> User:
    """A staff account with the agent permission and a profile."""
    agent = User.objects.create_user(username, password="pw", is_staff=True)
    agent.user_permissions.add(Permission.objects.get(codename="agent", content_type__app_label="chat"))
    AgentProfile.objects.create(user=agent, display_name=display_name, capacity=capacity)
    return User.objects.get(pk=agent.pk)  # permissions are cached per instance


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", password="pw")


@pytest.fixture
def client_alice(alice) -> Client:
    """Alice, signed in."""
    client = Client()
    client.force_login(alice)
    return client
