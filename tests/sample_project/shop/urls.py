from django.urls import path

from shop import views

urlpatterns = [
    path("api/products", views.products),
    path("api/orders", views.orders),
    path("api/export", views.export),
    path("api/live", views.live),
    path("api/search", views.Search.as_view()),
    path("newsletter/subscribe", views.subscribe),
    path("quote", views.quote),
]
