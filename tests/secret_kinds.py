"""One real-shaped example of each kind of secret that leaks through training logs (fake values in
the real formats), shared by the redactor's unit tests and the end-to-end test. ``DETECTOR``: the
detect-secrets plugin that finds the kind ("" where that catalogue has none: its formats are
checked by our tests alone)."""
from __future__ import annotations

from dataclasses import dataclass

PEM_BODY = ["MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun",
            "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK",
            "LxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW/VDL5AaWTg0nLVkjRo",
            "9z+tRHiVUEY0BmpVALEArYVd5QmEvnoOLAW0QjSGpHMb+i2LKn8N2Vj2YpqZmHh1",
            "hwIDAQABAoIBAQCK2XSESpKEvtNrjmNhyPVhcJbQYnZYGqO2F+jA1oCd/7zuL1cE"]
PEM = ["-----BEGIN RSA PRIVATE KEY-----", *PEM_BODY, "-----END RSA PRIVATE KEY-----"]
GCP_KEY = ("-----BEGIN PRIVATE KEY-----\\n" + "\\n".join(PEM_BODY) + "\\n-----END PRIVATE KEY-----\\n")


@dataclass(frozen=True)
class Kind:
    name: str
    line: str           # a log line holding it
    secret: str         # what must not survive
    kept: str           # what must
    detector: str       # detect-secrets' plugin class name ("": none for this kind)


KINDS = [
    Kind("private key (GCP service account JSON)",
         '{"type": "service_account", "project_id": "rl-proj", "private_key": "' + GCP_KEY + '"}',
         PEM_BODY[2], '"project_id": "rl-proj"', "PrivateKeyDetector"),
    Kind("slack webhook", "notify: posting to https://hooks.slack.com/services/T0ABCDE12/"
         "B0FGHIJ34/Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2 done", "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2",
         "https://hooks.slack.com/services/", "SlackDetector"),
    Kind("discord webhook", "alert -> https://discord.com/api/webhooks/1187654321098765432/"
         "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3kM5oQ7sU9wY1aC3eG5iK7mO9qS1uW3yA5c", "aB3dE5gH7jK9mN1p",
         "alert -> https://discord.com/api/webhooks/", ""),
    Kind("stripe", "billing: stripe.api_key set to sk_live_51HqLyjWDarjtT1zdp7dc4eC39 at boot",
         "51HqLyjWDarjtT1zdp7dc4eC39", "at boot", "StripeDetector"),
    Kind("twilio", "sms via account AC8f3a2b1c4d5e6f708192a3b4c5d6e7f8 queued",
         "AC8f3a2b1c4d5e6f708192a3b4c5d6e7f8", "sms via account", "TwilioKeyDetector"),
    Kind("sendgrid", "mail: using 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",
         "TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc-1s5cr", "mail: using", "SendGridDetector"),
    Kind("discord bot token", "discord client login MTEyMzQ1Njc4OTAxMjM0NTY3OA.GhIjKl."
         "abcdefghijklmnopqrstuvwxyz01234 ok", "MTEyMzQ1Njc4OTAxMjM0NTY3OA",
         "discord client login", "DiscordBotTokenDetector"),
    Kind("mailchimp", "newsletter key 0f1e2d3c4b5a69788796a5b4c3d2e1f0-us14 loaded",
         "0f1e2d3c4b5a69788796a5b4c3d2e1f0", "newsletter", "MailchimpDetector"),
    Kind("azure storage connection string", "AZURE_STORAGE_CONNECTION_STRING=DefaultEndpointsProtocol"
         "=https;AccountName=rlckpt;AccountKey=" + "Zm9vYmFyYmF6cXV4" * 5 + "Zm9vYmFyYg==;"
         "EndpointSuffix=core.windows.net", "Zm9vYmFyYmF6cXV4", "EndpointSuffix=core.windows.net",
         "AzureStorageKeyDetector"),
    Kind("npm", "//registry.npmjs.org/:_authToken=npm_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
         "npm_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", "//registry.npmjs.org/", "NpmDetector"),
    Kind("pypi", "twine upload -p pypi-AgEIcHlwaS5vcmcCJDFhYmNkZWZnaC0xMjM0LTU2NzgtOTBhYi1jZGVmMDEyMz"
         "Q1NjcAAiV7InBlcm1pc3Npb25zIjogInVzZXIifQ dist/*", "AgEIcHlwaS5vcmcCJDFhYmNkZWZnaC0x",
         "dist/*", "PypiTokenDetector"),
    Kind("gitlab", "git clone https://oauth2:glpat-Ab12Cd34Ef56Gh78Ij90@gitlab.com/x/y.git",
         "glpat-Ab12Cd34Ef56Gh78Ij90", "gitlab.com/x/y.git", "GitLabTokenDetector"),
    Kind("telegram", "bot 5512345678:AAH8gJ2kL9mN0pQ1rS2tU3vW4xY5zA6bC7d started",
         "AAH8gJ2kL9mN0pQ1rS2tU3vW4xY5zA6bC7d", "started", "TelegramBotTokenDetector"),
    Kind("square", "square client sq0csp-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefg ok",
         "sq0csp-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefg", "square client", "SquareOAuthDetector"),
    Kind("artifactory", "pip config: index-url auth AKCp8jQ8ZxV2mN5bR7tY9uW1 for art.example.com",
         "AKCp8jQ8ZxV2mN5bR7tY9uW1", "for art.example.com", "ArtifactoryDetector"),
    Kind("jwt", "auth ok: eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0cmFpbmVyIn0.Zm9vYmFyYmF6cXV4", "Zm9vYmFy",
         "auth ok:", "JwtTokenDetector"),
    Kind("basic auth url", "wandb base url https://trainer:Pa55-w0rd@wandb.example.com",
         "Pa55-w0rd", "@wandb.example.com", "BasicAuthDetector"),
    Kind("aws secret access key",
         'aws_secret_access_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"',
         "wJalrXUtnFEMI/K7MDENG", 'aws_secret_access_key = "***"', "AWSKeyDetector"),
    Kind("ibm cloud api key", "IBM_CLOUD_API_KEY=xLmN0pQ1rS2tU3vW4xY5zA6bC7dE8fG9hI0jK1lM2nO3",
         "xLmN0pQ1rS2tU3vW4xY5", "IBM_CLOUD_API_KEY=***", "IbmCloudIamDetector"),
    Kind("keyword", 'secret_key: "Qw3rty-uiop-7788" for signing', "Qw3rty-uiop-7788", "for signing",
         "KeywordDetector"),
]
