app_name = "rollouts"
urlpatterns = []
