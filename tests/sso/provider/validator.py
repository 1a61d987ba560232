from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsValidator(OAuth2Validator):
    """Claims as an identity provider sends them: a username, an e-mail and the
    person's groups (in the ID token and the userinfo, with the profile scope)."""

    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "profile"}

    def get_additional_claims(self, request):
        user = request.user
        return {
            "preferred_username": user.username,
            "email": user.email,
            "given_name": user.first_name,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }
